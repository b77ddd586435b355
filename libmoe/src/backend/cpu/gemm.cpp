#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include "moe/threads.h"

namespace moe::cpu {

namespace {

// OpenBLAS cuts a K (the summed dimension) longer than its K-block (GEMM_Q, about 450 for sgemm on
// SkylakeX) into blocks that its serial and threaded drivers round differently unless K is a
// multiple of twice the kernel's unroll: the same GEMM then rounds differently with 1 and 2
// threads. So every GEMM runs as its longest K prefix that is a multiple of kKMultiple, then the
// rest (fewer than kKMultiple, within one K-block) accumulated on top: one call when K is a
// multiple of 64 (model widths), one more pass over C otherwise (weight gradients summed over
// tokens). Measured cost: within noise (docs/PERFORMANCE.md, "Determinism costs nothing").
constexpr int64_t kKMultiple = 64;

void cblas_call(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc) {
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

}  // namespace

void sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS may leave C untouched; define it.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  const int64_t k_prefix = k / kKMultiple * kKMultiple;
  if (k_prefix == k || k_prefix == 0) {
    cblas_call(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cblas_call(transpose_a, transpose_b, m, n, k_prefix, alpha, a, lda, b, ldb, beta, c, ldc);
  // Columns k_prefix.. of op(A) and rows k_prefix.. of op(B).
  const float* a_rest = transpose_a ? a + k_prefix * lda : a + k_prefix;
  const float* b_rest = transpose_b ? b + k_prefix : b + k_prefix * ldb;
  cblas_call(transpose_a, transpose_b, m, n, k - k_prefix, alpha, a_rest, lda, b_rest, ldb, 1.0f, c,
             ldc);
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
