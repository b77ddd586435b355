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

#include <cstring>

#include "backend/cpu/block_fields.h"
#include "backend/cpu/gemv_blocks.h"

namespace moe::cpu::gemv_detail {
namespace {

using block_fields::e8m0_half;
using block_fields::load_f16;
using block_fields::load_f32;

// Lanes whose sum is scale times sum u_i s_i over 32 unsigned levels u (u < 64) and int8 s.
MOE_BLK_TARGET inline __m256i scaled_dot(__m256i u, __m256i s, int32_t scale) {
#if MOE_BLK_VNNI
  return _mm256_mullo_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s),
                            _mm256_set1_epi32(scale));
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s),
                           _mm256_set1_epi16(static_cast<int16_t>(scale)));
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

// The lane sums of four vectors: {sum v0, sum v1, sum v2, sum v3}.
MOE_BLK_TARGET inline __m128i lane_sums4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
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
// The 12 packed bytes as three words: sc 0-3 and m 0-3 are the low 6 bits of words 0 and 1; sc
// 4-7 (m 4-7) take their low 4 bits from word 2's low (high) nibbles and their high 2 from the top
// bits of word 0 (word 1), as quant_blocks.h lays them out.
MOE_BLK_TARGET inline float dot_q4k(const uint8_t* w, const uint8_t* a) {
  uint32_t word[3];
  std::memcpy(word, w + 4, sizeof word);
  const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, low2 = 0x03030303u;
  const uint32_t sc_words[2] = {word[0] & low6, (word[2] & low4) | ((word[0] >> 6) & low2) << 4};
  const uint32_t m_words[2] = {word[1] & low6, ((word[2] >> 4) & low4) | ((word[1] >> 6) & low2)
                                                                             << 4};
  uint8_t sc[8];
  std::memcpy(sc, sc_words, sizeof sc);
  const uint8_t* qs = w + 16;
  const uint8_t* q8 = a + 4;
  const __m256i nibble = _mm256_set1_epi8(15);
  __m256i levels = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {  // 64 values: sub-blocks 2c (low nibbles) and 2c + 1 (high)
    const __m256i q = load32(qs + 32 * c);
    const __m256i low = _mm256_and_si256(q, nibble);
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
    levels = _mm256_add_epi32(levels, scaled_dot(low, load32(q8 + 64 * c), sc[2 * c]));
    levels = _mm256_add_epi32(levels, scaled_dot(high, load32(q8 + 64 * c + 32), sc[2 * c + 1]));
  }
  // M: the 16 bsums (int16) times m_j, each m_j twice (bsums 2j and 2j + 1), in 32-bit pairs.
  __m128i m = _mm_cvtsi64_si128(static_cast<int64_t>(m_words[0] | uint64_t(m_words[1]) << 32));
  m = _mm_cvtepu8_epi16(m);
  const __m256i m_twice = _mm256_setr_m128i(_mm_unpacklo_epi16(m, m), _mm_unpackhi_epi16(m, m));
  const __m256i mins = _mm256_madd_epi16(load32(a + 260), m_twice);
  const __m128i sums = lane_sums4(levels, mins, _mm256_setzero_si256(), _mm256_setzero_si256());
  const float d8 = load_f32(a);
  return (load_f16(w) * d8) * static_cast<float>(_mm_cvtsi128_si32(sums)) -
         (load_f16(w + 2) * d8) * static_cast<float>(_mm_extract_epi32(sums, 1));
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

// mxfp4 x q8_0: (d8 2^(e - 128)) S, S = sum E2M1x2(nibble) a, by a table of E2M1x2 + 12: lanes
// whose sum is one block's S.
MOE_BLK_TARGET inline __m256i mxfp4_lanes(const uint8_t* w, const uint8_t* a, __m256i table) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 1));
  const __m128i nibble = _mm_set1_epi8(15);
  const __m256i index = _mm256_setr_m128i(_mm_and_si128(packed, nibble),
                                          _mm_and_si128(_mm_srli_epi16(packed, 4), nibble));
  const __m256i levels = _mm256_shuffle_epi8(table, index);
  return scaled_dot_offset(levels, load32(a + 2), _mm256_set1_epi8(12), 1, 1);
}

MOE_BLK_TARGET inline float mxfp4_block(const uint8_t* w, const uint8_t* a, int32_t sum) {
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
    default: {  // mxfp4 (dot_partner refused the activation formats): 4 blocks' S at a time
      const __m256i table = mxfp4_table();
      int64_t b = 0;
      for (; b + 4 <= blocks; b += 4) {
        const uint8_t* w = wrow + b * wbytes;
        const uint8_t* a = arow + b * abytes;
        alignas(16) int32_t s4[4];
        _mm_store_si128(
            reinterpret_cast<__m128i*>(s4),
            lane_sums4(mxfp4_lanes(w, a, table), mxfp4_lanes(w + wbytes, a + abytes, table),
                       mxfp4_lanes(w + 2 * wbytes, a + 2 * abytes, table),
                       mxfp4_lanes(w + 3 * wbytes, a + 3 * abytes, table)));
        for (int k = 0; k < 4; ++k) sum += mxfp4_block(w + k * wbytes, a + k * abytes, s4[k]);
      }
      for (; b < blocks; ++b) {
        const uint8_t* w = wrow + b * wbytes;
        const uint8_t* a = arow + b * abytes;
        sum += mxfp4_block(w, a, lane_sum(mxfp4_lanes(w, a, table)));
      }
      break;
    }
  }
  return sum;
}

}  // namespace moe::cpu::gemv_detail
