// The x86 copies of the block-format dot products (gemv_blocks.h: dot_block_row), compiled once
// per instruction set. Not a header for general use: a file includes it once, after defining
//   MOE_BLK_TARGET  the target attribute the functions here carry,
//   MOE_BLK_VNNI    1 where that target has AVX-512 VNNI (a block's integer sums by vpdpbusd on
//                   the same vectors), else 0 (vpmaddubsw + vpmaddwd),
//   MOE_BLK_WIDE    1 where q4_k's and q6_k's sums take 512-bit vectors (AVX-512 targets), else 0,
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
#if !defined(MOE_BLK_TARGET) || !defined(MOE_BLK_VNNI) || !defined(MOE_BLK_WIDE) || \
    !defined(MOE_BLK_ENTRY)
#error "define MOE_BLK_TARGET, MOE_BLK_VNNI, MOE_BLK_WIDE, MOE_BLK_ENTRY before this header"
#endif
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/block_fields.h"
#include "backend/cpu/gemv_blocks.h"

// GCC 12 reports its own _mm512_undefined_*() inside the AVX-512 intrinsics as maybe
// uninitialised (a false positive: every lane is written), as in gemv_q8_rows.h.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

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

#if MOE_BLK_WIDE
MOE_BLK_TARGET inline __m256i fold(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}
MOE_BLK_TARGET inline __m512i join(__m256i low, __m256i high) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
}
// The multiplier lanes of scaled_dot: 16 (or 32) bits, `low` in the low 256 bits, `high` above.
MOE_BLK_TARGET inline __m512i scale_halves(int32_t low, int32_t high) {
#if MOE_BLK_VNNI
  return join(_mm256_set1_epi32(low), _mm256_set1_epi32(high));
#else
  return join(_mm256_set1_epi16(static_cast<int16_t>(low)),
              _mm256_set1_epi16(static_cast<int16_t>(high)));
#endif
}
// Lanes whose sum is sum scale_i u_i s_i over 64 unsigned levels u (u < 64) and int8 s, scale the
// lanes of scale_halves or q6k_scales.
MOE_BLK_TARGET inline __m512i scaled_dot(__m512i u, __m512i s, __m512i scale) {
#if MOE_BLK_VNNI
  return _mm512_mullo_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s), scale);
#else
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), scale);
#endif
}

// q4_k's S as lanes, 64 values a step: bytes 64 c2 .. + 63 of qs hold sub-blocks 4 c2 and
// 4 c2 + 2 in their low nibbles (inputs 128 c2 .. + 31 and + 64 .. + 95), 4 c2 + 1 and 4 c2 + 3
// in their high ones (+ 32 .. + 63 and + 96 .. + 127).
MOE_BLK_TARGET inline __m256i q4k_levels(const uint8_t* qs, const uint8_t* q8, const uint8_t* sc) {
  const __m512i nibble = _mm512_set1_epi8(15);
  __m512i levels = _mm512_setzero_si512();
  for (int c2 = 0; c2 < 2; ++c2) {
    const __m512i q = _mm512_loadu_si512(qs + 64 * c2);
    const uint8_t* x = q8 + 128 * c2;
    const uint8_t* s = sc + 4 * c2;
    levels = _mm512_add_epi32(
        levels, scaled_dot(_mm512_and_si512(q, nibble), join(load32(x), load32(x + 64)),
                           scale_halves(s[0], s[2])));
    levels = _mm512_add_epi32(
        levels, scaled_dot(_mm512_and_si512(_mm512_srli_epi16(q, 4), nibble),
                           join(load32(x + 32), load32(x + 96)), scale_halves(s[1], s[3])));
  }
  return fold(levels);
}
#else
// q4_k's S as lanes, 32 values a step: qs[32 c .. + 31] holds sub-block 2c in its low nibbles
// (inputs 64 c .. + 31), 2c + 1 in its high ones (+ 32 .. + 63).
MOE_BLK_TARGET inline __m256i q4k_levels(const uint8_t* qs, const uint8_t* q8, const uint8_t* sc) {
  const __m256i nibble = _mm256_set1_epi8(15);
  __m256i levels = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    const __m256i q = load32(qs + 32 * c);
    const __m256i low = _mm256_and_si256(q, nibble);
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
    levels = _mm256_add_epi32(levels, scaled_dot(low, load32(q8 + 64 * c), sc[2 * c]));
    levels = _mm256_add_epi32(levels, scaled_dot(high, load32(q8 + 64 * c + 32), sc[2 * c + 1]));
  }
  return levels;
}
#endif

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
  const __m256i levels = q4k_levels(w + 16, a + 4, sc);
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

#if MOE_BLK_WIDE
// Multiplier lanes for 64 values in sub-blocks of 16: scales[0 .. 3], one per 128 bits.
MOE_BLK_TARGET inline __m512i q6k_scales(const int8_t* scales) {
  int32_t four;
  std::memcpy(&four, scales, sizeof four);
#if MOE_BLK_VNNI
  const __m512i index = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  return _mm512_permutexvar_epi32(
      index, _mm512_castsi128_si512(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four))));
#else
  // Lane i of 32 takes 16-bit scale i / 8: as 32-bit lanes, both halves of lane j take j / 4.
  const __m512i index = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m128i wide16 = _mm_cvtepi8_epi16(_mm_cvtsi32_si128(four));  // s0 s1 s2 s3 (16 bits)
  const __m128i paired = _mm_unpacklo_epi16(wide16, wide16);          // s0 s0 s1 s1 .. (32 bits)
  return _mm512_permutexvar_epi32(index, _mm512_castsi128_si512(paired));
#endif
}

// q6_k x q8_k: (d d8) S, S = sum_i scales_i sum (q - 32) a, 64 values a step: values 128 h + 32 k
// + l for k = 2 p (low 256 bits; ql[64 h + l]) and 2 p + 1 (high; ql[64 h + 32 + l]), nibble p of
// ql, bits 2 k of qh[32 h + l].
MOE_BLK_TARGET inline float dot_q6k(const uint8_t* w, const uint8_t* a) {
  const auto* scales = reinterpret_cast<const int8_t*>(w + 192);
  const uint8_t* q8 = a + 4;
  const __m512i nibble = _mm512_set1_epi8(15), two_bits = _mm512_set1_epi8(3);
  const __m512i offset = _mm512_set1_epi8(32);
  __m512i acc = _mm512_setzero_si512();
  for (int h = 0; h < 2; ++h) {
    const __m512i qh = _mm512_broadcast_i64x4(load32(w + 128 + 32 * h));
    const __m512i ql = _mm512_loadu_si512(w + 64 * h);
    for (int p = 0; p < 2; ++p) {
      const __m512i low = _mm512_and_si512(_mm512_srli_epi16(ql, 4 * p), nibble);
      const __m512i shift = join(_mm256_set1_epi16(static_cast<int16_t>(4 * p)),
                                 _mm256_set1_epi16(static_cast<int16_t>(4 * p + 2)));
      const __m512i high =
          _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift), two_bits), 4);
      const __m512i u = _mm512_or_si512(low, high);
      const __m512i x = _mm512_loadu_si512(q8 + 128 * h + 64 * p);
      const __m512i scale = q6k_scales(scales + 8 * h + 4 * p);
#if MOE_BLK_VNNI
      const __m512i sums = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x),
                                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, x));
      acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(sums, scale));
#else
      const __m512i pairs =
          _mm512_sub_epi16(_mm512_maddubs_epi16(u, x), _mm512_maddubs_epi16(offset, x));
      acc = _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, scale));
#endif
    }
  }
  return (load_f16(w + 208) * load_f32(a)) * static_cast<float>(lane_sum(fold(acc)));
}
#else
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
#endif

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
