// The decode GEMV over block-format weights (q4_k, q6_k, mxfp4; see gemv.h and gemv_blocks.h),
// scalar: each input row is quantised once per call to the weights' partner format, and each
// output is cpu::dot_row of its weight row and that row, llama.cpp's reference arithmetic (exact
// integer sums per block, combined in f32 block after block), in loops the compiler vectorises
// (dot_block_row), or in one of its x86 copies (gemv_blocks_simd.h: the same bits). One output,
// one thread, one order: the bits depend neither on the thread count nor on the copy.
// Shapes: m input rows of `in` elements, out x in weights, in a whole number of blocks.
#include "backend/cpu/gemv_blocks.h"

#include <limits>

#include "backend/cpu/block_fields.h"
#include "backend/cpu/gemv_internal.h"
#include "core/parallel.h"
#include "moe/error.h"

namespace moe::cpu::gemv_detail {
namespace {

using block_fields::e8m0_half;
using block_fields::kE2M1x2;
using block_fields::load_f16;
using block_fields::load_f32;
using block_fields::load_i16;

// The blocks' sums below are those of quant_blocks.cpp's dot products, formed in another order
// (integers: exact, so the same values) from loops over whole sub-blocks that the compiler
// vectorises (the reference decodes a level at a time; its q6_k read 0.3 GB/s of weights), and
// combined by the same f32 operations (this file builds without contraction): dot_row's bits.

// q4_k x q8_k: (d d8) S - (dmin d8) M, S = sum_j sc_j sum q a, M = sum_j m_j (bsums of j).
float dot_q4k(const uint8_t* w, const uint8_t* a) {
  const uint8_t* packed = w + 4;
  const uint8_t* qs = w + 16;
  const auto* q8 = reinterpret_cast<const int8_t*>(a + 4);
  int32_t levels = 0, mins = 0;
  for (int c = 0; c < 4; ++c) {  // 64 values: sub-blocks 2c (low nibbles) and 2c + 1 (high)
    int32_t low = 0, high = 0;
    for (int l = 0; l < 32; ++l) {
      low += (qs[32 * c + l] & 15) * q8[64 * c + l];
      high += (qs[32 * c + l] >> 4) * q8[64 * c + 32 + l];
    }
    for (int half = 0; half < 2; ++half) {
      const int j = 2 * c + half;
      const int32_t sc = j < 4 ? packed[j] & 63 : (packed[j + 4] & 15) | (packed[j - 4] >> 6) << 4;
      const int32_t m = j < 4 ? packed[j + 4] & 63 : (packed[j + 4] >> 4) | (packed[j] >> 6) << 4;
      levels += sc * (half ? high : low);
      mins += m * (load_i16(a + 260 + 4 * j) + load_i16(a + 262 + 4 * j));
    }
  }
  const float d8 = load_f32(a);
  return (load_f16(w) * d8) * static_cast<float>(levels) -
         (load_f16(w + 2) * d8) * static_cast<float>(mins);
}

// q6_k x q8_k: (d d8) S, S = sum_i scales_i sum (q - 32) a.
float dot_q6k(const uint8_t* w, const uint8_t* a) {
  const uint8_t* ql = w;
  const uint8_t* qh = w + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(w + 192);
  const auto* q8 = reinterpret_cast<const int8_t*>(a + 4);
  int32_t levels = 0;
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k) {  // values 128 h + 32 k + l: sub-blocks 8 h + 2 k and + 1
      const uint8_t* low = ql + 64 * h + 32 * (k & 1);
      const int shift = 4 * (k >> 1);
      const int8_t* x = q8 + 128 * h + 32 * k;
      int32_t first = 0, second = 0;
      for (int l = 0; l < 16; ++l)
        first += ((((low[l] >> shift) & 15) | ((qh[32 * h + l] >> 2 * k) & 3) << 4) - 32) * x[l];
      for (int l = 16; l < 32; ++l)
        second += ((((low[l] >> shift) & 15) | ((qh[32 * h + l] >> 2 * k) & 3) << 4) - 32) * x[l];
      levels += scales[8 * h + 2 * k] * first + scales[8 * h + 2 * k + 1] * second;
    }
  return (load_f16(w + 208) * load_f32(a)) * static_cast<float>(levels);
}

// mxfp4 x q8_0: (d8 2^(e - 128)) S, S = sum E2M1x2(nibble) a (doubled E2M1 values: integers).
float dot_mxfp4(const uint8_t* w, const uint8_t* a) {
  const auto* q8 = reinterpret_cast<const int8_t*>(a + 2);
  int32_t sum = 0;
  for (int j = 0; j < 16; ++j)
    sum += kE2M1x2[w[1 + j] & 15] * q8[j] + kE2M1x2[w[1 + j] >> 4] * q8[j + 16];
  return (load_f16(a) * e8m0_half(w[0])) * static_cast<float>(sum);
}

}  // namespace

float dot_block_row(BlockFormat weights, const uint8_t* wrow, const uint8_t* arow, int64_t n) {
  const int64_t blocks = n / block_elems(weights);
  const int64_t wbytes = block_bytes(weights), abytes = block_bytes(dot_partner(weights));
  float sum = 0;
  switch (weights) {
    case BlockFormat::q4_k:
      for (int64_t b = 0; b < blocks; ++b) sum += dot_q4k(wrow + b * wbytes, arow + b * abytes);
      break;
    case BlockFormat::q6_k:
      for (int64_t b = 0; b < blocks; ++b) sum += dot_q6k(wrow + b * wbytes, arow + b * abytes);
      break;
    default:  // mxfp4 (dot_partner refused the activation formats)
      for (int64_t b = 0; b < blocks; ++b) sum += dot_mxfp4(wrow + b * wbytes, arow + b * abytes);
      break;
  }
  return sum;
}

void BlockInput::build(const float* rows, int64_t ld, int64_t count, int64_t n, BlockFormat to) {
  x = rows, ldx = ld, m = count, in = n, partner = to;
  row_bytes = block_row_bytes(to, n);
  bytes.resize(static_cast<size_t>(m * row_bytes));
  usable.assign(static_cast<size_t>(m), 1);
  for (int64_t i = 0; i < m; ++i) {
    // quantize_row refuses what its format cannot hold (non-finite values; a q8_0 block past its
    // f16 scale): such a row's products are NaN, as the f32 product would not be finite either.
    try {
      quantize_row(to, rows + i * ld, n, bytes.data() + i * row_bytes);
    } catch (const Error&) {
      usable[static_cast<size_t>(i)] = 0;
    }
  }
}

DotBlockRow dot_block_row_for(GemvIsa isa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  switch (isa) {
    case GemvIsa::avx2:
      return dot_block_row_avx2;
    case GemvIsa::avx512:
      return dot_block_row_avx512;
    case GemvIsa::avx512_vnni:
      return dot_block_row_vnni;
    default:
      break;
  }
#endif
  (void)isa;
  return dot_block_row;
}

void block_rows(const GemvProblem& p, const BlockInput& x, int64_t begin, int64_t end,
                DotBlockRow dot) {
  const BlockFormat format = block_format(p.w.format);
  const int64_t row_bytes = block_row_bytes(format, p.w.in);
  const auto* base = static_cast<const uint8_t*>(p.w.data);
  for (int64_t o = begin; o < end; ++o)
    for (int64_t i = 0; i < p.m; ++i)
      store_output(p, i, o,
                   x.usable[static_cast<size_t>(i)]
                       ? dot(format, base + o * row_bytes, x.row(i), p.w.in)
                       : std::numeric_limits<float>::quiet_NaN());
}

void widen_block_rows(const WeightMatrix& w, int64_t row, int64_t rows, float* out) {
  const BlockFormat format = block_format(w.format);
  const int64_t row_bytes = block_row_bytes(format, w.in);
  const auto* base = static_cast<const uint8_t*>(w.data);
#pragma omp parallel for schedule(static) if (rows * w.in >= kParallelWork)
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(format, base + (row + r) * row_bytes, w.in, out + r * w.in);
}

}  // namespace moe::cpu::gemv_detail
