// llama.cpp's block formats for 4- and 6-bit weights (Q4_K, Q6_K, MXFP4) and the 8-bit
// activations ggml multiplies them with (Q8_K, Q8_0), byte for byte as GGUF stores them: a row in
// one of these formats is exported to GGUF, or imported from it, as a plain copy.
//
// Shapes: a row holds n values, n a whole number of the format's blocks of B values; a block is
// `block_bytes` bytes, a row n / B blocks laid end to end. All multi-byte fields little-endian;
// f16 is IEEE half, E8M0 a bare exponent byte (2^(e - 127)), E2M1 a 4-bit float (sign, 2 exponent
// bits, 1 mantissa bit: 0 0.5 1 1.5 2 3 4 6).
//
//   q4_k   B = 256, 144 bytes: f16 d | f16 dmin | scales[12] | qs[128]
//          8 sub-blocks of 32, each with a 6-bit scale sc and a 6-bit min m packed in scales[]:
//          sub-block j < 4: sc = scales[j] & 63, m = scales[j + 4] & 63; j >= 4: sc =
//          (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4, m = (scales[j + 4] >> 4) |
//          (scales[j] >> 6) << 4. qs: for each 64 values c, byte qs[32 c + l] holds value 64 c + l
//          in its low nibble q and value 64 c + 32 + l in its high one.
//          value = d * sc * q - dmin * m,  q in 0..15.
//   q6_k   B = 256, 210 bytes: ql[128] | qh[64] | int8 scales[16] | f16 d
//          16 sub-blocks of 16, each with an int8 scale. For each half h (128 values) and l < 32,
//          the 6-bit q of value 128 h + 32 k + l (k = 0..3) has its low 4 bits in ql[64 h + l]
//          (k = 0: low nibble, k = 2: high nibble) or ql[64 h + 32 + l] (k = 1 low, k = 3 high)
//          and its high 2 bits in bits 2k..2k+1 of qh[32 h + l].
//          value = d * scales[i / 16] * (q - 32),  q in 0..63.
//   mxfp4  B = 32, 17 bytes: E8M0 e | qs[16]  (OCP Microscaling MXFP4, ggml's nibble order)
//          qs[j] holds value j in its low nibble and value j + 16 in its high one.
//          value = E2M1(nibble) * 2^(e - 127).
//   q8_k   B = 256, 292 bytes: f32 d | int8 qs[256] | int16 bsums[16]
//          value = d * qs[i];  bsums[j] = the sum of qs[16 j .. 16 j + 15].
//   q8_0   B = 32, 34 bytes: f16 d | int8 qs[32].  value = d * qs[i].
//
// Quantisers give the bytes of llama.cpp's reference quantisers (quantize_row_q4_K_ref, _q6_K_ref,
// _mxfp4_ref, _q8_K_ref, _q8_0_ref; no importance matrix), dequantisers its floats: the tests
// hold golden bytes from llama.cpp (tests/data/quant_golden/). Where ggml is undefined we choose:
// MXFP4 blocks whose largest magnitude is below 2^-125 take e = 0, and an all-zero Q8_K block
// gets zero bsums. Quantisers refuse (moe::Error) NaN and infinite inputs, and blocks whose f16
// scale would overflow (about 65504 * 63 = 4.1e6 below zero and a 6e7 spread for q4_k, 65504 *
// 128 * 32 = 2.7e8 for q6_k, 65504 * 127 = 8.3e6 for q8_0); the row's bytes are unspecified then.
//
// Dot products: a weight row times an activation row in the weight format's partner (q4_k, q6_k:
// q8_k; mxfp4: q8_0), as exact integer sums per block combined in f32, block after block:
//   q4_k: ((d * d8) * S - (dmin * d8) * M) with S = sum_j sc_j sum q * a, M = sum_j m_j * (the
//         sub-block's bsums);   q6_k: (d * d8) * S, S = sum_i scales_i sum (q - 32) * a;
//   mxfp4: (d8 * 2^(e - 128)) * S, S = sum E2M1x2(nibble) * a  (ggml's generic mxfp4 x q8_0 bits).
// Any vector copy that forms the same integer sums and the same f32 operations gives these bits.
#pragma once
#include <cstdint>
#include <string>

namespace moe::cpu {

enum class BlockFormat : uint8_t { q4_k, q6_k, mxfp4, q8_k, q8_0 };

const char* block_format_name(BlockFormat format);  // "q4_k", "q6_k", "mxfp4", "q8_k", "q8_0"
// The format of a name block_format_name gives; moe::Error naming the name otherwise.
BlockFormat parse_block_format(const std::string& name);
int64_t block_elems(BlockFormat format);  // B: 256 or 32
int64_t block_bytes(BlockFormat format);  // 144, 210, 17, 292, 34
// The bytes of a row of n values; moe::Error naming n and the format unless n is a whole number
// of blocks (n >= 0).
int64_t block_row_bytes(BlockFormat format, int64_t n);

// x[n] -> out[block_row_bytes(format, n)], llama.cpp's reference bytes.
void quantize_row(BlockFormat format, const float* x, int64_t n, uint8_t* out);
// row[block_row_bytes(format, n)] -> out[n], llama.cpp's dequantised floats.
void dequantize_row(BlockFormat format, const uint8_t* row, int64_t n, float* out);

// The activation format a weight format multiplies with: q8_k for q4_k and q6_k, q8_0 for mxfp4;
// moe::Error for q8_k and q8_0 (activation formats themselves).
BlockFormat dot_partner(BlockFormat weights);
// sum_i w_i * a_i over a weight row and an activation row (in dot_partner(weights)), n values.
float dot_row(BlockFormat weights, const uint8_t* wrow, const uint8_t* arow, int64_t n);

// The scale one block's values are multiplied by, as a float (q4_k: d, and dmin in *second; q6_k,
// q8_0: d; q8_k: its f32 d; mxfp4: 2^(e - 127), NaN for e = 0xFF, E8M0's NaN); *second is 0 but
// for q4_k. A loader refuses a block whose scales are not finite (a damaged file).
float block_scale(BlockFormat format, const uint8_t* block, float* second);

}  // namespace moe::cpu
