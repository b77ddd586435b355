// CPU loops of the core ops (moe/ops/core.h): GEMM through cpu::sgemm, elementwise loops.
#include <algorithm>
#include <cmath>

#include "backend/cpu/backend.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemv.h"
#include "core/parallel.h"
#include "kernels/convert.h"

namespace moe::cpu {

void gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
          float alpha, float beta) {
  int64_t m = transpose_a ? a.dim(1) : a.dim(0);
  int64_t k = transpose_a ? a.dim(0) : a.dim(1);
  int64_t n = transpose_b ? b.dim(0) : b.dim(1);
  // x W^T with a [out, in] weight: a few rows (decode) stream the weight once through the GEMV;
  // 16-bit weights are widened into a reused scratch for the tiled sgemm (gemv.h).
  if (!transpose_a && transpose_b && alpha == 1.0f) {
    const WeightMatrix w = weight_matrix(b, 0, k);
    if (gemv_applies(m)) {
      const GemvProblem p{w, a.data<float>(), a.dim(1), m, c.data<float>(), c.dim(1), beta};
      gemv_batch(&p, 1);
      return;
    }
    // A panel of the weight's rows at a time (one panel unless the weight is wider than
    // kWidenedFloats): columns [j, j + panel) of c.
    const int64_t panel = std::max<int64_t>(1, kWidenedFloats / std::max<int64_t>(k, 1));
    for (int64_t j = 0; j < n; j += panel) {
      const int64_t cols = std::min(panel, n - j);
      sgemm(false, true, m, cols, k, alpha, a.data<float>(), a.dim(1), widened_rows(w, j, cols), k,
            beta, c.data<float>() + j, c.dim(1));
    }
    return;
  }
  sgemm(transpose_a, transpose_b, m, n, k, alpha, a.data<float>(), a.dim(1), b.data<float>(),
        b.dim(1), beta, c.data<float>(), c.dim(1));
}

void axpy(float alpha, const Tensor& x, Tensor& y) {
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) ys[i] += alpha * xs[i];
}

void scale(Tensor& x, float alpha) {
  float* xs = x.data<float>();
  int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) xs[i] *= alpha;
}

void round_to_dtype(Tensor& x, DType dtype) {
  float* p = x.data<float>();
  int64_t n = x.numel();
  if (dtype == DType::bf16) {
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
    for (int64_t i = 0; i < n; ++i) p[i] = kernels::bf16_to_f32(kernels::f32_to_bf16(p[i]));
  } else if (dtype == DType::f16) {
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
    for (int64_t i = 0; i < n; ++i) p[i] = kernels::f16_to_f32(kernels::f32_to_f16(p[i]));
  } else {
    throw Error(str("round_to_dtype: ", dtype_name(dtype), " is not a floating type"));
  }
}

double sum_squares(const Tensor& x) {
  const float* p = x.data<float>();
  double s = 0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) s += static_cast<double>(p[i]) * p[i];
  return s;
}

}  // namespace moe::cpu
