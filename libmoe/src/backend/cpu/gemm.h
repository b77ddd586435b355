// The one GEMM entry point of the CPU backend (CBLAS; OpenBLAS by default). Swap the library here.
#pragma once
#include <cstdint>

namespace moe::cpu {

// Row-major C[M,N] = alpha * op(A)[M,K] op(B)[K,N] + beta * C.
void sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc);

// Threads for BLAS and OpenMP loops.
void set_num_threads(int threads);
int num_threads();

}  // namespace moe::cpu
