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

#include <cstring>

#include "backend/cpu/gemv_q8.h"

// GCC 12 reports its own _mm512_undefined_ps() inside the AVX-512 intrinsics as maybe
// uninitialised (a false positive: every lane is written), as in gemv.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace moe::cpu::gemv_detail {
namespace {

// R weight rows by M input rows: per pair of blocks, 64 weights of each row against the same 64
// inputs of each input row, R x M accumulators (their chains hide the latency), the next R rows
// prefetched a line at a time (a decode row is too short for the hardware prefetcher).
template <int M, int R>
MOE_Q8_TARGET void q8_block(const GemvProblem& p, const Q8Input& x, int64_t o) {
  const int64_t in = p.w.in, blocks = q8_blocks(in);
  const __m512i zero = _mm512_setzero_si512();
#if !MOE_Q8_VNNI
  const __m512i ones = _mm512_set1_epi16(1);
#endif
  __m512 acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i) acc[r][i] = _mm512_setzero_ps();
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = q8_row(p.w, o + r);
  for (int64_t t = 0; t < x.pairs; ++t) {
    const int64_t j = t * 64;
    const __mmask64 mask = in - j >= 64 ? ~__mmask64{0} : (__mmask64{1} << (in - j)) - 1;
    __m512i xq[M];
    __m512 xs[M];
    for (int i = 0; i < M; ++i) {
      xq[i] = _mm512_loadu_si512(x.q_row(i) + j);
      xs[i] = _mm512_loadu_ps(x.scale_row(i) + t * kLanes);
    }
    for (int r = 0; r < R; ++r) {
      if (o + R + r < p.w.out)
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + R * q8_row_bytes(in) + j),
                     _MM_HINT_T0);
      const __m512i w = _mm512_maskz_loadu_epi8(mask, rows[r] + j);
      const __m512i wabs = _mm512_abs_epi8(w);
      const __mmask64 negative = _mm512_movepi8_mask(w);
      uint16_t h[2] = {0, 0};
      std::memcpy(h, rows[r] + in + 4 * t, 2 * t + 1 < blocks ? 4 : 2);
      const __m512 dw =
          _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(_cvtsh_ss(h[0])),
                               _mm512_set1_ps(2 * t + 1 < blocks ? _cvtsh_ss(h[1]) : 0.0f));
      for (int i = 0; i < M; ++i) {
        const __m512i sx = _mm512_mask_sub_epi8(xq[i], negative, zero, xq[i]);
#if MOE_Q8_VNNI
        const __m512i sum = _mm512_dpbusd_epi32(zero, wabs, sx);
#else
        const __m512i sum = _mm512_madd_epi16(_mm512_maddubs_epi16(wabs, sx), ones);
#endif
        acc[r][i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, xs[i]), _mm512_cvtepi32_ps(sum), acc[r][i]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i) {
      alignas(64) float lane[kLanes];
      _mm512_store_ps(lane, acc[r][i]);
      store_output(p, i, o + r, reduce_lanes(lane));
    }
}

template <int M>
void q8_rows_m(const GemvProblem& p, const Q8Input& x, int64_t begin, int64_t end) {
  constexpr int R = M <= 2 ? 8 : M <= 4 ? 2 : 1;
  int64_t o = begin;
  for (; o + R <= end; o += R) q8_block<M, R>(p, x, o);
  for (; o < end; ++o) q8_block<M, 1>(p, x, o);
}

}  // namespace

// Output rows [begin, end) of problem p against its quantised input rows x.
void MOE_Q8_ENTRY(const GemvProblem& p, const Q8Input& x, int64_t begin, int64_t end) {
  with_rows(p.m, [&](auto m) { q8_rows_m<decltype(m)::value>(p, x, begin, end); });
}

}  // namespace moe::cpu::gemv_detail
