#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include "moe/threads.h"

namespace moe::cpu {

void sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS may leave C untouched; define it.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

void set_num_threads(int threads) {
  if (threads <= 0) return;
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace moe::cpu

namespace moe {
void set_num_threads(int threads) { cpu::set_num_threads(threads); }
int num_threads() { return cpu::num_threads(); }
}  // namespace moe
