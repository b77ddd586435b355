// The x86 copies of the block-format dot products (gemv_blocks.h: dot_block_row), compiled once
// per instruction set. Not a header for general use: a file includes it once, after defining
//   MOE_BLK_TARGET  the target attribute the functions here carry,
//   MOE_BLK_VNNI    1 where that target has AVX-512 VNNI (a block's integer sums by vpdpbusd on
//                   256-bit vectors), else 0 (vpmaddubsw + vpmaddwd),
//   MOE_BLK_ENTRY   the name of the dot_block_row copy it defines (declared in gemv_blocks.h),
// and gets that function over kernels in an unnamed namespace. gemv_blocks_avx2.cpp,
// gemv_blocks_avx512.cpp and gemv_blocks_vnni.cpp compile it (only the last target names VNNI,
// so no VNNI instruction is in the path of CPUs without it).
//
// The bits are dot_row's (quant_blocks.h): each block's integer sums are the scalar body's exact
// values, formed from unsigned levels times int8 inputs (pairs of products fit 16 bits: no
// vpmaddubsw saturation on any bytes), and combined by the same f32 operations block after block
// (the including files build without contraction). Signed levels are made unsigned by an offset
// whose product with the inputs is subtracted, exactly: q6_k's q - 32 is sum q a - sum 32 a, and
// mxfp4's doubled E2M1 value v is sum (v + 12) a - sum 12 a (an int8 input of -128 has no
// negation in int8, so the sign trick ggml uses would not be exact on any bytes).
#if !defined(MOE_BLK_TARGET) || !defined(MOE_BLK_VNNI) || !defined(MOE_BLK_ENTRY)
#error "define MOE_BLK_TARGET, MOE_BLK_VNNI and MOE_BLK_ENTRY before including gemv_blocks_simd.h"
#endif
#include <immintrin.h>

#include "backend/cpu/block_fields.h"
#include "backend/cpu/gemv_blocks.h"

namespace moe::cpu::gemv_detail {
namespace {

using block_fields::e8m0_half;
using block_fields::load_f16;
using block_fields::load_f32;
using block_fields::load_i16;

// Lanes whose sum is scale times sum u_i s_i over 32 unsigned levels u (u < 64) and int8 s; the
// low 16 bytes take scale_lo, the high 16 scale_hi.
MOE_BLK_TARGET inline __m256i scaled_dot(__m256i u, __m256i s, int32_t scale_lo, int32_t scale_hi) {
#if MOE_BLK_VNNI
  const __m256i sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
  return _mm256_mullo_epi32(sums, _mm256_setr_epi32(scale_lo, scale_lo, scale_lo, scale_lo,
                                                    scale_hi, scale_hi, scale_hi, scale_hi));
#else
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
  return _mm256_madd_epi16(pairs,
                           _mm256_setr_m128i(_mm_set1_epi16(static_cast<int16_t>(scale_lo)),
                                             _mm_set1_epi16(static_cast<int16_t>(scale_hi))));
#endif
}

// As scaled_dot, of (u - offset) s: the offset's products subtracted (exact, in 16 or 32 bits).
MOE_BLK_TARGET inline __m256i scaled_dot_offset(__m256i u, __m256i s, __m256i offset,
                                                int32_t scale_lo, int32_t scale_hi) {
#if MOE_BLK_VNNI
  const __m256i sums = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s),
                                        _mm256_dpbusd_epi32(_mm256_setzero_si256(), offset, s));
  return _mm256_mullo_epi32(sums, _mm256_setr_epi32(scale_lo, scale_lo, scale_lo, scale_lo,
                                                    scale_hi, scale_hi, scale_hi, scale_hi));
#else
  // |pair of (u - offset) s| <= 2 * 32 * 128: the difference of the two pair sums fits 16 bits.
  const __m256i pairs =
      _mm256_sub_epi16(_mm256_maddubs_epi16(u, s), _mm256_maddubs_epi16(offset, s));
  return _mm256_madd_epi16(pairs,
                           _mm256_setr_m128i(_mm_set1_epi16(static_cast<int16_t>(scale_lo)),
                                             _mm_set1_epi16(static_cast<int16_t>(scale_hi))));
#endif
}

MOE_BLK_TARGET inline int32_t lane_sum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

MOE_BLK_TARGET inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// q4_k x q8_k: (d d8) S - (dmin d8) M, S = sum_j sc_j sum q a, M = sum_j m_j (bsums of j).
MOE_BLK_TARGET inline float dot_q4k(const uint8_t* w, const uint8_t* a) {
  const uint8_t* packed = w + 4;
  const uint8_t* qs = w + 16;
  const uint8_t* q8 = a + 4;
  const __m256i nibble = _mm256_set1_epi8(15);
  __m256i acc = _mm256_setzero_si256();
  int32_t mins = 0;
  for (int c = 0; c < 4; ++c) {  // 64 values: sub-blocks 2c (low nibbles) and 2c + 1 (high)
    int32_t sc[2];
    for (int half = 0; half < 2; ++half) {
      const int j = 2 * c + half;
      sc[half] = j < 4 ? packed[j] & 63 : (packed[j + 4] & 15) | (packed[j - 4] >> 6) << 4;
      const int32_t m = j < 4 ? packed[j + 4] & 63 : (packed[j + 4] >> 4) | (packed[j] >> 6) << 4;
      mins += m * (load_i16(a + 260 + 4 * j) + load_i16(a + 262 + 4 * j));
    }
    const __m256i q = load32(qs + 32 * c);
    const __m256i low = _mm256_and_si256(q, nibble);
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
    acc = _mm256_add_epi32(acc, scaled_dot(low, load32(q8 + 64 * c), sc[0], sc[0]));
    acc = _mm256_add_epi32(acc, scaled_dot(high, load32(q8 + 64 * c + 32), sc[1], sc[1]));
  }
  const int32_t levels = lane_sum(acc);
  const float d8 = load_f32(a);
  return (load_f16(w) * d8) * static_cast<float>(levels) -
         (load_f16(w + 2) * d8) * static_cast<float>(mins);
}

// q6_k x q8_k: (d d8) S, S = sum_i scales_i sum (q - 32) a.
MOE_BLK_TARGET inline float dot_q6k(const uint8_t* w, const uint8_t* a) {
  const auto* scales = reinterpret_cast<const int8_t*>(w + 192);
  const uint8_t* q8 = a + 4;
  const __m256i nibble = _mm256_set1_epi8(15), two_bits = _mm256_set1_epi8(3);
  const __m256i offset = _mm256_set1_epi8(32);
  __m256i acc = _mm256_setzero_si256();
  for (int h = 0; h < 2; ++h) {
    const __m256i qh = load32(w + 128 + 32 * h);
    const __m256i ql[2] = {load32(w + 64 * h), load32(w + 64 * h + 32)};
    for (int k = 0; k < 4; ++k) {  // values 128 h + 32 k + l: sub-blocks 8 h + 2 k and + 1
      const __m256i low = _mm256_and_si256(_mm256_srli_epi16(ql[k & 1], 4 * (k >> 1)), nibble);
      const __m256i high =
          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), two_bits), 4);
      acc = _mm256_add_epi32(
          acc, scaled_dot_offset(_mm256_or_si256(low, high), load32(q8 + 128 * h + 32 * k), offset,
                                 scales[8 * h + 2 * k], scales[8 * h + 2 * k + 1]));
    }
  }
  return (load_f16(w + 208) * load_f32(a)) * static_cast<float>(lane_sum(acc));
}

// mxfp4 x q8_0: (d8 2^(e - 128)) S, S = sum E2M1x2(nibble) a, by a table of E2M1x2 + 12.
MOE_BLK_TARGET inline float dot_mxfp4(const uint8_t* w, const uint8_t* a, __m256i table) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 1));
  const __m128i nibble = _mm_set1_epi8(15);
  const __m256i index = _mm256_setr_m128i(_mm_and_si128(packed, nibble),
                                          _mm_and_si128(_mm_srli_epi16(packed, 4), nibble));
  const __m256i levels = _mm256_shuffle_epi8(table, index);
  const int32_t sum =
      lane_sum(scaled_dot_offset(levels, load32(a + 2), _mm256_set1_epi8(12), 1, 1));
  return (load_f16(a) * e8m0_half(w[0])) * static_cast<float>(sum);
}

MOE_BLK_TARGET inline __m256i mxfp4_table() {
  alignas(16) int8_t t[16];
  for (int i = 0; i < 16; ++i) t[i] = static_cast<int8_t>(block_fields::kE2M1x2[i] + 12);
  const __m128i half = _mm_load_si128(reinterpret_cast<const __m128i*>(t));
  return _mm256_setr_m128i(half, half);
}

}  // namespace

MOE_BLK_TARGET float MOE_BLK_ENTRY(BlockFormat weights, const uint8_t* wrow, const uint8_t* arow,
                                   int64_t n) {
  const int64_t blocks = n / block_elems(weights);
  const int64_t wbytes = block_bytes(weights), abytes = block_bytes(dot_partner(weights));
  float sum = 0;  // block after block, as dot_row
  switch (weights) {
    case BlockFormat::q4_k:
      for (int64_t b = 0; b < blocks; ++b) sum += dot_q4k(wrow + b * wbytes, arow + b * abytes);
      break;
    case BlockFormat::q6_k:
      for (int64_t b = 0; b < blocks; ++b) sum += dot_q6k(wrow + b * wbytes, arow + b * abytes);
      break;
    default: {  // mxfp4 (dot_partner refused the activation formats)
      const __m256i table = mxfp4_table();
      for (int64_t b = 0; b < blocks; ++b)
        sum += dot_mxfp4(wrow + b * wbytes, arow + b * abytes, table);
      break;
    }
  }
  return sum;
}

}  // namespace moe::cpu::gemv_detail
