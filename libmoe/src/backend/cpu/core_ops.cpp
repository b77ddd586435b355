#include <cmath>

#include "backend/cpu/gemm.h"
#include "backend/cpu/parallel.h"
#include "kernels/convert.h"
#include "moe/ops/core.h"
#ifdef MOE_HAVE_CUDA
#include "backend/cuda/core_ops.h"
#include "backend/cuda/moe_ops.h"  // scale_in_place
#endif

namespace moe::ops {

Device require_backend(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t || !t->defined()) continue;
    if (!backend_available(t->device().kind))
      throw Error(str(op, ": ", t->describe(), " is on a device this build has no backend for"));
    if (!first) {
      first = t;
    } else if (!(t->device() == first->device())) {
      throw Error(
          str(op, ": operands on different devices: ", first->describe(), " and ", t->describe()));
    }
  }
  return first ? first->device() : Device{};
}

void gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
          float alpha, float beta) {
  [[maybe_unused]] const Device device = require_backend("gemm", {&a, &b, &c});
  MOE_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2, "gemm: 2-D operands expected, got ",
            a.describe(), ", ", b.describe(), ", ", c.describe());
  a.expect_dtype(DType::f32, "gemm A");
  b.expect_dtype(DType::f32, "gemm B");
  c.expect_dtype(DType::f32, "gemm C");
  int64_t m = transpose_a ? a.dim(1) : a.dim(0);
  int64_t k = transpose_a ? a.dim(0) : a.dim(1);
  int64_t kb = transpose_b ? b.dim(1) : b.dim(0);
  int64_t n = transpose_b ? b.dim(0) : b.dim(1);
  MOE_CHECK(k == kb && c.dim(0) == m && c.dim(1) == n, "gemm: shapes do not chain: ", a.describe(),
            transpose_a ? "^T" : "", " x ", b.describe(), transpose_b ? "^T" : "", " -> ",
            c.describe());
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda)
    return cuda::gemm(a, transpose_a, b, transpose_b, c, alpha, beta);
#endif
  cpu::sgemm(transpose_a, transpose_b, m, n, k, alpha, a.data<float>(), a.dim(1), b.data<float>(),
             b.dim(1), beta, c.data<float>(), c.dim(1));
}

void axpy(float alpha, const Tensor& x, Tensor& y) {
  [[maybe_unused]] const Device device = require_backend("axpy", {&x, &y});
  MOE_CHECK(x.shape() == y.shape(), "axpy: ", x.describe(), " vs ", y.describe());
  x.expect_dtype(DType::f32, "axpy x");
  y.expect_dtype(DType::f32, "axpy y");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::axpy(alpha, x, y);
#endif
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i) ys[i] += alpha * xs[i];
}

void scale(Tensor& x, float alpha) {
  [[maybe_unused]] const Device device = require_backend("scale", {&x});
  x.expect_dtype(DType::f32, "scale");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::scale_in_place(x, alpha);
#endif
  float* xs = x.data<float>();
  int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i) xs[i] *= alpha;
}

void round_to_dtype(Tensor& x, DType dtype) {
  [[maybe_unused]] const Device device = require_backend("round_to_dtype", {&x});
  if (dtype == DType::f32) return;
  x.expect_dtype(DType::f32, "round_to_dtype");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::round_to_dtype(x, dtype);
#endif
  float* p = x.data<float>();
  int64_t n = x.numel();
  if (dtype == DType::bf16) {
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelWork)
    for (int64_t i = 0; i < n; ++i) p[i] = kernels::bf16_to_f32(kernels::f32_to_bf16(p[i]));
  } else if (dtype == DType::f16) {
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelWork)
    for (int64_t i = 0; i < n; ++i) p[i] = kernels::f16_to_f32(kernels::f32_to_f16(p[i]));
  } else {
    throw Error(str("round_to_dtype: ", dtype_name(dtype), " is not a floating type"));
  }
}

double sum_squares(const Tensor& x) {
  [[maybe_unused]] const Device device = require_backend("sum_squares", {&x});
  x.expect_dtype(DType::f32, "sum_squares");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::sum_squares(x);
#endif
  const float* p = x.data<float>();
  double s = 0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) s += static_cast<double>(p[i]) * p[i];
  return s;
}

}  // namespace moe::ops
