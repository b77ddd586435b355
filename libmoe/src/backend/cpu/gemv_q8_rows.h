// The AVX-512 Q8_0 row kernel (gemv_q8.h), compiled once per instruction set. Not a header for
// general use: a file includes it once, after defining
//   MOE_Q8_TARGET  the target attribute the kernels here carry,
//   MOE_Q8_VNNI    1 where that target has AVX-512 VNNI (the integer sums by vpdpbusd), else 0
//                  (vpmaddubsw + vpmaddwd),
//   MOE_Q8_ENTRY   the name of the entry point it defines (declared in gemv_q8.h),
// and gets that function (the rows of one task) over kernels in an unnamed namespace.
// gemv_q8_avx512.cpp compiles it without VNNI in the target, so no VNNI instruction can appear in
// the path AVX-512 CPUs without VNNI run (Skylake-SP); gemv_q8_vnni.cpp compiles it with. Both
// form the same exact integer sums (|w| as u8 times x with w's sign, in 4s) and the same f32
// operations on them. Shapes: m input rows, out x in weights; a pair of blocks is 64 elements.
#if !defined(MOE_Q8_TARGET) || !defined(MOE_Q8_VNNI) || !defined(MOE_Q8_ENTRY)
#error "define MOE_Q8_TARGET, MOE_Q8_VNNI and MOE_Q8_ENTRY before including gemv_q8_rows.h"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/gemv_q8.h"

// GCC 12 reports its own _mm512_undefined_ps() inside the AVX-512 intrinsics as maybe
// uninitialised (a false positive: every lane is written), as in gemv.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace moe::cpu::gemv_detail {
namespace {

// The 64 weights of a pair against the same 64 inputs of M input rows, into acc[0 .. M): integer
// sums of |w| and x with w's sign, scaled by (weight scale x input scale) of each block.
template <int M>
MOE_Q8_TARGET inline void q8_pair_dot(const uint8_t* values, const uint8_t* scales,
                                      const __m512i* xq, const __m512* xs, __m512* acc) {
  const __m512i zero = _mm512_setzero_si512();
#if !MOE_Q8_VNNI
  const __m512i ones = _mm512_set1_epi16(1);
#endif
  const __m512i w = _mm512_loadu_si512(values);
  const __m512i wabs = _mm512_abs_epi8(w);
  const __mmask64 negative = _mm512_movepi8_mask(w);
  uint16_t h[2];
  std::memcpy(h, scales, sizeof h);  // a pair's second scale is 0 past the last block
  const __m512 dw = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(_cvtsh_ss(h[0])),
                                         _mm512_set1_ps(_cvtsh_ss(h[1])));
  for (int i = 0; i < M; ++i) {
    const __m512i sx = _mm512_mask_sub_epi8(xq[i], negative, zero, xq[i]);
#if MOE_Q8_VNNI
    const __m512i sum = _mm512_dpbusd_epi32(zero, wabs, sx);
#else
    const __m512i sum = _mm512_madd_epi16(_mm512_maddubs_epi16(wabs, sx), ones);
#endif
    acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, xs[i]), _mm512_cvtepi32_ps(sum), acc[i]);
  }
}

// Input rows i0 .. i0 + M - 1, quantised, at pair t.
template <int M>
MOE_Q8_TARGET inline void q8_inputs(const Q8Input& x, int64_t i0, int64_t t, __m512i* xq,
                                    __m512* xs) {
  for (int i = 0; i < M; ++i) {
    xq[i] = _mm512_loadu_si512(x.q_row(i0 + i) + t * 64);
    xs[i] = _mm512_loadu_ps(x.scale_row(i0 + i) + t * kLanes);
  }
}

template <int M>
MOE_Q8_TARGET inline void q8_store(const GemvProblem& p, int64_t i0, int64_t o, __m512* acc) {
  for (int i = 0; i < M; ++i) {
    alignas(64) float lane[kLanes];
    _mm512_store_ps(lane, acc[i]);
    store_output(p, i0 + i, o, reduce_lanes(lane));
  }
}

// A whole group (rows o .. o + 7, o a multiple of 8) against input rows i0 .. i0 + M - 1 (M <= 2:
// 8 x M accumulators, whose chains hide the latency). The group is read front to back, pair after
// pair (8 x 68 bytes each), the pair kAheadPairs on prefetched line by line (a decode matrix is
// too short for the hardware prefetchers to follow).
template <int M>
MOE_Q8_TARGET void q8_group(const GemvProblem& p, const Q8Input& x, int64_t o, int64_t i0) {
  constexpr int64_t kAheadPairs = 16, kPair = kQ8Group * kQ8PairBytes;
  const auto* const base = static_cast<const uint8_t*>(p.w.data);
  const int64_t bytes = p.w.out * q8_group_row_bytes(p.w.in);
  const int64_t group = o * q8_group_row_bytes(p.w.in);
  __m512 acc[kQ8Group][M];
  for (int r = 0; r < kQ8Group; ++r)
    for (int i = 0; i < M; ++i) acc[r][i] = _mm512_setzero_ps();
  for (int64_t t = 0; t < x.pairs; ++t) {
    const int64_t ahead = group + (t + kAheadPairs) * kPair;
    for (int64_t b = ahead; b < std::min(bytes, ahead + kPair); b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(base + b), _MM_HINT_T0);
    __m512i xq[M];
    __m512 xs[M];
    q8_inputs<M>(x, i0, t, xq, xs);
    const uint8_t* pair = base + group + t * kPair;
    for (int r = 0; r < kQ8Group; ++r)
      q8_pair_dot<M>(pair + r * 2 * kQ8Block, pair + kQ8Group * 2 * kQ8Block + r * 4, xq, xs,
                     acc[r]);
  }
  for (int r = 0; r < kQ8Group; ++r) q8_store<M>(p, i0, o + r, acc[r]);
}

// One row (of a last, partial group, or before the first whole one) against all M input rows,
// the next row's pair prefetched.
template <int M>
MOE_Q8_TARGET void q8_row(const GemvProblem& p, const Q8Input& x, int64_t o) {
  const auto* const base = static_cast<const uint8_t*>(p.w.data);
  __m512 acc[M];
  for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t t = 0; t < x.pairs; ++t) {
    if (o + 1 < p.w.out)
      _mm_prefetch(
          reinterpret_cast<const char*>(base + q8_pair_offsets(p.w.out, p.w.in, o + 1, t).values),
          _MM_HINT_T0);
    __m512i xq[M];
    __m512 xs[M];
    q8_inputs<M>(x, 0, t, xq, xs);
    const Q8Pair pair = q8_pair(p.w, o, t);
    q8_pair_dot<M>(pair.values, pair.scales, xq, xs, acc);
  }
  q8_store<M>(p, 0, o, acc);
}

// Whole groups 8 rows at a time, against 2 input rows at a time, so every group is read front to
// back, once per 2 input rows (from cache after the first); other rows one at a time, against all
// M input rows. Each output's operations are the same whichever way it is reached.
template <int M>
void q8_rows_m(const GemvProblem& p, const Q8Input& x, int64_t begin, int64_t end) {
  int64_t o = begin;
  for (; o < end && o % kQ8Group != 0; ++o) q8_row<M>(p, x, o);
  for (; o + kQ8Group <= end; o += kQ8Group) {
    int64_t i = 0;
    for (; i + 2 <= M; i += 2) q8_group<2>(p, x, o, i);
    if (i < M) q8_group<1>(p, x, o, i);
  }
  for (; o < end; ++o) q8_row<M>(p, x, o);
}

}  // namespace

// Output rows [begin, end) of problem p against its quantised input rows x.
void MOE_Q8_ENTRY(const GemvProblem& p, const Q8Input& x, int64_t begin, int64_t end) {
  with_rows(p.m, [&](auto m) { q8_rows_m<decltype(m)::value>(p, x, begin, end); });
}

}  // namespace moe::cpu::gemv_detail
