// The Q8_0 decode GEMV against 8-bit input rows (gemv.h): the input rows' quantiser, the scalar
// path, and the choice of AVX-512 rows (gemv_q8_rows.h, compiled with VNNI's vpdpbusd in
// gemv_q8_vnni.cpp and with vpmaddubsw + vpmaddwd in gemv_q8_avx512.cpp). All three form the
// same exact integer sums and the same f32 operations on them, so their bits agree.
// Shapes: m input rows, out x in weights; a block is kQ8Block = 32 elements, a pair of blocks 64.
#include "backend/cpu/gemv_q8.h"

#include <algorithm>
#include <cmath>
#include <limits>

// GCC 12 reports its own _mm512_undefined_ps() inside the AVX-512 intrinsics as maybe
// uninitialised (a false positive: every lane is written), as in gemv.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace moe::cpu {

void quantize_q8_input_row(const float* x, int64_t n, int8_t* q, float* scale) {
  for (int64_t b = 0; b < q8_blocks(n); ++b) {
    const int64_t begin = b * kQ8Block, end = std::min(n, begin + kQ8Block);
    float amax = 0;
    bool finite = true;
    for (int64_t j = begin; j < end; ++j) {
      finite = finite && std::isfinite(x[j]);
      amax = std::max(amax, std::fabs(x[j]));
    }
    const float s = amax / 127.0f;
    if (!finite || !std::isfinite(s)) {
      std::fill(q + begin, q + end, int8_t{0});
      scale[b] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    scale[b] = s;
    for (int64_t j = begin; j < end; ++j) q[j] = gemv_detail::q8_quantize(x[j], s);
  }
}

namespace gemv_detail {

#if MOE_GEMV_X86
namespace {
// round-to-nearest-even(v / s) clamped to [-127, 127] (s 0: zeros), as int32 lanes.
MOE_TARGET_GEMV512 inline __m512i quantise16(__m512 v, float s) {
  if (s == 0.0f) return _mm512_setzero_si512();
  const __m512 r = _mm512_roundscale_ps(_mm512_div_ps(v, _mm512_set1_ps(s)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_cvtps_epi32(
      _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f)));
}

// quantize_q8_input_row with 16 lanes: the same largest magnitude (max is exact in any order),
// the same f32 division and round-to-nearest-even, the same clamp: the same bytes and scales.
MOE_TARGET_GEMV512 void quantize_row_avx512(const float* x, int64_t n, int8_t* q, float* scale) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t b = 0; b < q8_blocks(n); ++b) {
    const int64_t begin = b * kQ8Block, len = std::min(kQ8Block, n - begin);
    const auto mask = [](int64_t k) {
      return static_cast<__mmask16>(k >= 16 ? 0xffff : k <= 0 ? 0 : (1u << k) - 1u);
    };
    const __mmask16 m0 = mask(len), m1 = mask(len - 16);
    const __m512 v0 = _mm512_maskz_loadu_ps(m0, x + begin),
                 v1 = _mm512_maskz_loadu_ps(m1, x + begin + 16);
    // x - x is NaN exactly for a NaN or an infinity.
    if (_mm512_cmp_ps_mask(_mm512_sub_ps(v0, v0), zero, _CMP_NEQ_UQ) |
        _mm512_cmp_ps_mask(_mm512_sub_ps(v1, v1), zero, _CMP_NEQ_UQ)) {
      std::fill(q + begin, q + begin + len, int8_t{0});
      scale[b] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float s = amax / 127.0f;
    scale[b] = s;
    _mm512_mask_cvtepi32_storeu_epi8(q + begin, m0, quantise16(v0, s));
    _mm512_mask_cvtepi32_storeu_epi8(q + begin + 16, m1, quantise16(v1, s));
  }
}
}  // namespace
#endif

void quantize_input_row(const float* x, int64_t n, int8_t* q, float* scale, bool wide) {
#if MOE_GEMV_X86
  if (wide) return quantize_row_avx512(x, n, q, scale);
#endif
  (void)wide;
  quantize_q8_input_row(x, n, q, scale);
}

void Q8Input::build(const float* rows, int64_t ld, int64_t count, int64_t n, bool wide) {
  x = rows;
  ldx = ld;
  m = count;
  in = n;
  pairs = (q8_blocks(n) + 1) / 2;
  padded = pairs * 2 * kQ8Block;
  // assign() keeps the vectors' capacity: no allocation once warm.
  q.assign(static_cast<size_t>(m * padded), 0);
  scale.assign(static_cast<size_t>(m * pairs * 16), 0.0f);
  block.assign(static_cast<size_t>(2 * pairs), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    quantize_input_row(rows + i * ld, n, q.data() + i * padded, block.data(), wide);
    float* s = scale.data() + i * pairs * 16;
    for (int64_t l = 0; l < pairs * 16; ++l) s[l] = block[static_cast<size_t>(l / 8)];
  }
}

void q8_rows_scalar(const GemvProblem& p, const Q8Input& x, int64_t begin, int64_t end) {
  const int64_t in = p.w.in, blocks = q8_blocks(in);
  for (int64_t o = begin; o < end; ++o) {
    float lanes[kGemvMaxRows][kLanes] = {};
    for (int64_t t = 0; t < x.pairs; ++t) {
      const Q8Pair pair = q8_pair(p.w, o, t);
      // The weight scales of blocks 2 t and 2 t + 1 (0 past the last block: the padding's lanes).
      const float dw[2] = {f16_at(pair.scales), 2 * t + 1 < blocks ? f16_at(pair.scales + 2) : 0};
      for (int64_t i = 0; i < p.m; ++i) {
        const int8_t* xq = x.q_row(i) + t * 64;
        const float* xs = x.scale_row(i) + t * kLanes;
        for (int64_t l = 0; l < kLanes; ++l) {
          int32_t sum = 0;
          for (int64_t j = 4 * l; j < std::min(in - t * 64, 4 * l + 4); ++j)
            sum += static_cast<int32_t>(static_cast<int8_t>(pair.values[j])) * xq[j];
          lanes[i][l] = std::fma(dw[l / 8] * xs[l], static_cast<float>(sum), lanes[i][l]);
        }
      }
    }
    for (int64_t i = 0; i < p.m; ++i) store_output(p, i, o, reduce_lanes(lanes[i]));
  }
}

#if MOE_GEMV_X86
void q8_rows_avx512(const GemvProblem& p, const Q8Input& x, int64_t begin, int64_t end, bool vnni) {
  if (vnni) return q8_rows_avx512_vnni(p, x, begin, end);
  q8_rows_avx512_plain(p, x, begin, end);
}
#endif

}  // namespace gemv_detail
}  // namespace moe::cpu
