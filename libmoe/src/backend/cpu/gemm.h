// The one GEMM entry point of the CPU backend. Each tile runs one tile kernel (gemm_kernel.h): our
// AVX-512 kernel where the CPU has AVX-512, else one CBLAS call (OpenBLAS by default; swap the
// library here). The choice is made once per process from the CPU's features (GemmKernel below).
//
// Determinism by construction: the BLAS always runs single-threaded, and we cut every product
// into tiles of C whose boundaries depend only on the shape (m, n, k), never on the thread count.
// Each tile is one BLAS call with the same operands whichever thread runs it, so every element of
// C is computed by the same call at any thread count, whatever the BLAS kernel's blocking.
// Threads come from our own OpenMP loop over the tiles (docs/ARCHITECTURE.md, "Determinism").
#pragma once
#include <cstddef>
#include <cstdint>

namespace moe::cpu {

// Row-major C[M,N] = alpha * op(A)[M,K] op(B)[K,N] + beta * C.
struct GemmProblem {
  bool transpose_a = false, transpose_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  float* c = nullptr;
  int64_t ldc = 0;
};

void sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc);

// Independent products (their C regions must not overlap), all their tiles in one parallel loop:
// the grouped expert GEMMs and per-head attention products use this so that many small products
// share the threads instead of each running alone.
void sgemm_batch(const GemmProblem* problems, size_t count);

// The tile grid of a product: a pure function of (m, n, k). Exposed for tests.
struct GemmTiling {
  int64_t tile_m, tile_n;    // rows and columns of C per tile (the last ones may be shorter)
  int64_t tiles_m, tiles_n;  // tiles along M and N
};
GemmTiling gemm_tiling(int64_t m, int64_t n, int64_t k);

// Benchmarks only: how cpu::sgemm runs. `tiled` is the library's (deterministic) path;
// `vendor_threaded` hands each product whole to the BLAS with its own threads, as this library
// did before 2026-11-25: sometimes faster, but its rounding then depends on the BLAS kernel's
// thread split. moe-bench times both in one run.
enum class GemmPath { tiled, vendor_threaded };
void set_gemm_path(GemmPath path);
GemmPath gemm_path();

// The tile kernel: `avx512` (ours, gemm_avx512.cpp) on CPUs with AVX-512 F/VL/DQ/BW and FMA,
// `blas` (a single-threaded CBLAS call) elsewhere, and for tiles of fewer than
// kGemmAvx512MinRows rows or kGemmAvx512MinCols columns (ours computes 4+ rows by 32 columns at
// a time: it would mostly multiply padding there; decode's single rows, router logits). Chosen
// by CPU features only, never by timings, so a host always computes the same bits. The
// environment variable MOE_GEMM=blas forces the CBLAS kernel (benchmarks, comparisons);
// MOE_GEMM=avx512 asks for ours and fails on a CPU without it; unset or `auto`: the default.
enum class GemmKernel { blas, avx512 };
constexpr int64_t kGemmAvx512MinRows = 4, kGemmAvx512MinCols = 16;
const char* gemm_kernel_name(GemmKernel kernel);
GemmKernel gemm_kernel();  // the kernel in use (first call: CPU features and MOE_GEMM)
// Benchmarks and tests: switch kernels in this process. Throws moe::UsageError for avx512 on a
// CPU without it. Not thread-safe with GEMMs in flight.
void set_gemm_kernel(GemmKernel kernel);
bool gemm_kernel_supported(GemmKernel kernel);

// Threads for our OpenMP loops (the BLAS itself stays single-threaded).
void set_num_threads(int threads);
int num_threads();

}  // namespace moe::cpu
