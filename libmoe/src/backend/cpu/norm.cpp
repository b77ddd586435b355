// LayerNorm / RMSNorm over rows: OpenMP over rows for y and dx, over column blocks (rows in
// order) for the parameter gradients. Shapes: x, y, dy, dx [N, D]; weight, bias [D]; mean, rstd
// [N].
#include "kernels/norm.h"

#include <algorithm>

#include "backend/cpu/parallel.h"
#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#ifdef MOE_HAVE_CUDA
#include "backend/cuda/dense_ops.h"
#endif

namespace moe::ops {

namespace {
// Loops over fewer elements than this run on the calling thread: a fork/join costs more.

constexpr int64_t kColumnBlock = 64;

int64_t check_rows(const Tensor& x, const char* op) {
  MOE_CHECK(x.ndim() == 2, op, ": input ", x.describe(), " is not 2-D [N,D]");
  x.expect_dtype(DType::f32, op);
  return x.dim(0);
}

void check_f32(const Tensor& t, const Shape& shape, const char* what) {
  t.expect_shape(shape, what);
  t.expect_dtype(DType::f32, what);
}

// dweight (and dbias) += per-row contributions, parallel over column blocks, rows in order.
void accumulate_param_grads(const Tensor& dy, const Tensor& x, const float* mean, const float* rstd,
                            Tensor& dweight, Tensor* dbias) {
  const int64_t n = x.dim(0), d = x.dim(1);
  const float* g = dy.data<float>();
  const float* xs = x.data<float>();
  float* dw = dweight.data<float>();
  float* db = dbias ? dbias->data<float>() : nullptr;
  const int64_t blocks = (d + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (n * d >= cpu::kParallelWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kColumnBlock, j1 = std::min(d, j0 + kColumnBlock);
    for (int64_t i = 0; i < n; ++i)
      kernels::norm_param_grad_row(g + i * d, xs + i * d, mean ? mean[i] : 0.0f, rstd[i], j0, j1,
                                   dw, db);
  }
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       Tensor& y, Tensor* mean, Tensor* rstd) {
  [[maybe_unused]] const Device device =
      require_backend("layernorm_forward", {&x, &weight, &bias, &y, mean, rstd});
  const int64_t n = check_rows(x, "layernorm_forward"), d = x.dim(1);
  check_f32(weight, {d}, "layernorm_forward weight");
  check_f32(bias, {d}, "layernorm_forward bias");
  check_f32(y, {n, d}, "layernorm_forward output");
  if (mean) check_f32(*mean, {n}, "layernorm_forward mean");
  if (rstd) check_f32(*rstd, {n}, "layernorm_forward rstd");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda)
    return cuda::layernorm_forward(x, weight, bias, eps, y, mean, rstd);
#endif
  const float* xs = x.data<float>();
  const float* w = weight.data<float>();
  const float* b = bias.data<float>();
  float* ys = y.data<float>();
  float* ms = mean ? mean->data<float>() : nullptr;
  float* rs = rstd ? rstd->data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (n * d >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    float m, r;
    kernels::layernorm_row(xs + i * d, w, b, ys + i * d, d, eps, &m, &r);
    if (ms) ms[i] = m;
    if (rs) rs[i] = r;
  }
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor* dbias) {
  [[maybe_unused]] const Device device =
      require_backend("layernorm_backward", {&dy, &x, &weight, &mean, &rstd, &dx, &dweight, dbias});
  const int64_t n = check_rows(x, "layernorm_backward"), d = x.dim(1);
  check_f32(dy, {n, d}, "layernorm_backward dy");
  check_f32(weight, {d}, "layernorm_backward weight");
  check_f32(mean, {n}, "layernorm_backward mean");
  check_f32(rstd, {n}, "layernorm_backward rstd");
  check_f32(dx, {n, d}, "layernorm_backward dx");
  check_f32(dweight, {d}, "layernorm_backward weight gradient");
  if (dbias) check_f32(*dbias, {d}, "layernorm_backward bias gradient");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda)
    return cuda::layernorm_backward(dy, x, weight, mean, rstd, dx, dweight, dbias);
#endif
  const float* g = dy.data<float>();
  const float* xs = x.data<float>();
  const float* w = weight.data<float>();
  const float* ms = mean.data<float>();
  const float* rs = rstd.data<float>();
  float* dxs = dx.data<float>();
#pragma omp parallel for schedule(static) if (n * d >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i)
    kernels::layernorm_row_backward(g + i * d, xs + i * d, w, ms[i], rs[i], dxs + i * d, d);
  accumulate_param_grads(dy, x, ms, rs, dweight, dbias);
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor* rstd) {
  [[maybe_unused]] const Device device =
      require_backend("rmsnorm_forward", {&x, &weight, &y, rstd});
  const int64_t n = check_rows(x, "rmsnorm_forward"), d = x.dim(1);
  check_f32(weight, {d}, "rmsnorm_forward weight");
  check_f32(y, {n, d}, "rmsnorm_forward output");
  if (rstd) check_f32(*rstd, {n}, "rmsnorm_forward rstd");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::rmsnorm_forward(x, weight, eps, y, rstd);
#endif
  const float* xs = x.data<float>();
  const float* w = weight.data<float>();
  float* ys = y.data<float>();
  float* rs = rstd ? rstd->data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (n * d >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    float r;
    kernels::rmsnorm_row(xs + i * d, w, ys + i * d, d, eps, &r);
    if (rs) rs[i] = r;
  }
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      Tensor& dx, Tensor& dweight) {
  [[maybe_unused]] const Device device =
      require_backend("rmsnorm_backward", {&dy, &x, &weight, &rstd, &dx, &dweight});
  const int64_t n = check_rows(x, "rmsnorm_backward"), d = x.dim(1);
  check_f32(dy, {n, d}, "rmsnorm_backward dy");
  check_f32(weight, {d}, "rmsnorm_backward weight");
  check_f32(rstd, {n}, "rmsnorm_backward rstd");
  check_f32(dx, {n, d}, "rmsnorm_backward dx");
  check_f32(dweight, {d}, "rmsnorm_backward weight gradient");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::rmsnorm_backward(dy, x, weight, rstd, dx, dweight);
#endif
  const float* g = dy.data<float>();
  const float* xs = x.data<float>();
  const float* w = weight.data<float>();
  const float* rs = rstd.data<float>();
  float* dxs = dx.data<float>();
#pragma omp parallel for schedule(static) if (n * d >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i)
    kernels::rmsnorm_row_backward(g + i * d, xs + i * d, w, rs[i], dxs + i * d, d);
  accumulate_param_grads(dy, x, nullptr, rs, dweight, nullptr);
}

}  // namespace moe::ops
