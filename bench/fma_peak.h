// The machine's arithmetic ceiling for fp32 GEMMs: fused multiply-adds on registers only, as
// many independent chains as hide the FMA latency, on every OpenMP thread at once. No GEMM can
// run faster, so a benchmark prints it beside its GEMM rates (a rate over it would be a
// measurement error) and a step's GEMM operations over it bound the step from below.
//
// The widest vectors the CPU runs (AVX-512, else AVX2 + FMA) through target attributes, so the
// bench builds for any x86-64; elsewhere, or on a CPU with neither, 0 (unknown).
#pragma once
#include <omp.h>

#include <chrono>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace moe::bench {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
namespace fma_detail {

// 24 chains: enough to cover a 4-cycle FMA latency on two pipes several times over. The values
// stay finite (x -> x b + c with b < 1 converges), so no denormal or overflow slows a lane.
constexpr int kChains = 24;

__attribute__((target("avx512f"))) inline float chains_avx512(long iterations) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1.0f + static_cast<float>(i) * 1e-3f);
  const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
  for (long it = 0; it < iterations; ++it)
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
  __m512 total = _mm512_setzero_ps();
  for (int i = 0; i < kChains; ++i) total = _mm512_add_ps(total, acc[i]);
  alignas(64) float lanes[16];  // not _mm512_reduce_add_ps: GCC 12 warns inside it
  _mm512_store_ps(lanes, total);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}

__attribute__((target("avx2,fma"))) inline float chains_avx2(long iterations) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(1.0f + static_cast<float>(i) * 1e-3f);
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
  for (long it = 0; it < iterations; ++it)
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], b, c);
  __m256 total = _mm256_setzero_ps();
  for (int i = 0; i < kChains; ++i) total = _mm256_add_ps(total, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}

}  // namespace fma_detail

// GFLOP/s (2 per lane per FMA) of all OpenMP threads together: best of `rounds` runs of about
// `seconds_per_round` each. 0 when the CPU has neither AVX-512 nor AVX2 + FMA.
inline double fma_peak_gflops(double seconds_per_round = 0.1, int rounds = 5) {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!avx512 && !avx2) return 0;
  const double lanes = avx512 ? 16 : 8;
  auto run = [&](long iterations) {
    volatile float sink = 0;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel
    {
      const float s =
          avx512 ? fma_detail::chains_avx512(iterations) : fma_detail::chains_avx2(iterations);
      if (s == -1.0f) sink = s;  // keeps the chains live; never true for these values
    }
    (void)sink;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // Grow the iteration count until one run takes a tenth of the round, then scale to the round.
  long iterations = 1 << 12;
  double seconds = run(iterations);
  while (seconds < seconds_per_round / 10) {
    iterations *= 4;
    seconds = run(iterations);
  }
  iterations = static_cast<long>(static_cast<double>(iterations) * seconds_per_round / seconds) + 1;
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    const double s = run(iterations);
    const double flops = 2.0 * lanes * fma_detail::kChains * static_cast<double>(iterations) *
                         static_cast<double>(omp_get_max_threads());
    if (flops / s / 1e9 > best) best = flops / s / 1e9;
  }
  return best;
}
#else
inline double fma_peak_gflops(double = 0.1, int = 5) { return 0; }
#endif

}  // namespace moe::bench
