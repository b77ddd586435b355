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

namespace {
// A block's input scale and multiplier from its largest magnitude, as ggml's CPU backend makes
// the activation blocks of its q8_0 products (quantize_row_q8_0): the values are quantised
// against the f32 multiplier 127 / amax, and the scale amax / 127 is rounded to f16 (the block's
// stored d, which the products use). A scale beyond f16's range (amax > 127 x 65504, where ggml's
// would be infinite) stays in f32. A scale 0 (an all-zero block, or one below 127 x 2^-25, where
// f16 underflows) takes multiplier 0: q 0, as its products are 0 either way.
struct InputScale {
  float scale, inverse;
};
InputScale input_scale(float amax) {
  const float s = amax / 127.0f;
  const uint16_t h = kernels::f32_to_f16(s);
  const float scale = (h & 0x7c00u) == 0x7c00u ? s : kernels::f16_to_f32(h);
  return {scale, scale > 0 ? 127.0f / amax : 0.0f};
}

// x times the block's multiplier, rounded to nearest even, clamped to [-127, 127] (|x| <= amax
// makes |x| 127 / amax at most 127 and an ulp: the clamp only catches that ulp).
inline int8_t quantise_input(float x, float inverse) {
  return static_cast<int8_t>(std::clamp(std::nearbyint(x * inverse), -127.0f, 127.0f));
}
}  // namespace

void quantize_q8_input_row(const float* x, int64_t n, int8_t* q, float* scale) {
  for (int64_t b = 0; b < q8_blocks(n); ++b) {
    const int64_t begin = b * kQ8Block, end = std::min(n, begin + kQ8Block);
    float amax = 0;
    bool finite = true;
    for (int64_t j = begin; j < end; ++j) {
      finite = finite && std::isfinite(x[j]);
      amax = std::max(amax, std::fabs(x[j]));
    }
    if (!finite) {
      std::fill(q + begin, q + end, int8_t{0});
      scale[b] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const InputScale s = input_scale(amax);
    scale[b] = s.scale;
    for (int64_t j = begin; j < end; ++j) q[j] = quantise_input(x[j], s.inverse);
  }
}

namespace gemv_detail {

#if MOE_GEMV_X86
namespace {
// round-to-nearest-even(v x inverse) clamped to [-127, 127], as int32 lanes (quantise_input).
MOE_TARGET_GEMV512 inline __m512i quantise16(__m512 v, float inverse) {
  const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(inverse)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_cvtps_epi32(
      _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f)));
}

// quantize_q8_input_row with 16 lanes: the same largest magnitude (max is exact in any order),
// the same scale and f32 multiplier (input_scale), round-to-nearest-even and clamp: the same
// bytes and scales.
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
    const InputScale s = input_scale(amax);
    scale[b] = s.scale;
    _mm512_mask_cvtepi32_storeu_epi8(q + begin, m0, quantise16(v0, s.inverse));
    _mm512_mask_cvtepi32_storeu_epi8(q + begin + 16, m1, quantise16(v1, s.inverse));
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
