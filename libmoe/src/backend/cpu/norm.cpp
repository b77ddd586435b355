// CPU LayerNorm / RMSNorm over rows: OpenMP over rows for y and dx, over column blocks (rows in
// order) for the parameter gradients. Shapes: x, y, dy, dx [N, D]; weight, bias [D]; mean, rstd
// [N].
#include "kernels/norm.h"

#include <algorithm>

#include "backend/cpu/backend.h"
#include "core/parallel.h"

namespace moe::cpu {

namespace {

constexpr int64_t kColumnBlock = 64;

// dweight (and dbias) += per-row contributions, parallel over column blocks, rows in order.
void accumulate_param_grads(const Tensor& dy, const Tensor& x, const float* mean, const float* rstd,
                            Tensor& dweight, Tensor* dbias) {
  const int64_t n = x.dim(0), d = x.dim(1);
  const float* g = dy.data<float>();
  const float* xs = x.data<float>();
  float* dw = dweight.data<float>();
  float* db = dbias ? dbias->data<float>() : nullptr;
  const int64_t blocks = (d + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (n * d >= kParallelWork)
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
  const int64_t n = x.dim(0), d = x.dim(1);
  const float* xs = x.data<float>();
  const float* w = weight.data<float>();
  const float* b = bias.data<float>();
  float* ys = y.data<float>();
  float* ms = mean ? mean->data<float>() : nullptr;
  float* rs = rstd ? rstd->data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (n * d >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    float m, r;
    kernels::layernorm_row(xs + i * d, w, b, ys + i * d, d, eps, &m, &r);
    if (ms) ms[i] = m;
    if (rs) rs[i] = r;
  }
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor* dbias) {
  const int64_t n = x.dim(0), d = x.dim(1);
  const float* g = dy.data<float>();
  const float* xs = x.data<float>();
  const float* w = weight.data<float>();
  const float* ms = mean.data<float>();
  const float* rs = rstd.data<float>();
  float* dxs = dx.data<float>();
#pragma omp parallel for schedule(static) if (n * d >= kParallelWork)
  for (int64_t i = 0; i < n; ++i)
    kernels::layernorm_row_backward(g + i * d, xs + i * d, w, ms[i], rs[i], dxs + i * d, d);
  accumulate_param_grads(dy, x, ms, rs, dweight, dbias);
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor* rstd) {
  const int64_t n = x.dim(0), d = x.dim(1);
  const float* xs = x.data<float>();
  const float* w = weight.data<float>();
  float* ys = y.data<float>();
  float* rs = rstd ? rstd->data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (n * d >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    float r;
    kernels::rmsnorm_row(xs + i * d, w, ys + i * d, d, eps, &r);
    if (rs) rs[i] = r;
  }
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      Tensor& dx, Tensor& dweight) {
  const int64_t n = x.dim(0), d = x.dim(1);
  const float* g = dy.data<float>();
  const float* xs = x.data<float>();
  const float* w = weight.data<float>();
  const float* rs = rstd.data<float>();
  float* dxs = dx.data<float>();
#pragma omp parallel for schedule(static) if (n * d >= kParallelWork)
  for (int64_t i = 0; i < n; ++i)
    kernels::rmsnorm_row_backward(g + i * d, xs + i * d, w, rs[i], dxs + i * d, d);
  accumulate_param_grads(dy, x, nullptr, rs, dweight, nullptr);
}

}  // namespace moe::cpu
