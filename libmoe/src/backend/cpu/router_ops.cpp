// CPU router loops: jitter, softmax or sigmoid scores, top-k and the router row backward (the load
// and the aux/z losses run on the host in ops/router.cpp), a centred router's weight, and the
// shared expert gate's sigmoid.
// Shapes: N tokens, D model width, E experts, k experts per token. Every loop writes whole rows
// from one thread.
#include <algorithm>
#include <vector>

#include "backend/cpu/backend.h"
#include "core/parallel.h"
#include "kernels/activations.h"
#include "kernels/router.h"

namespace moe::cpu {

void router_jitter(const Tensor& x, float jitter, uint64_t key, Tensor& noise, Tensor& routed,
                   int64_t first_row) {
  const float* xs = x.data<float>();
  float* ns = noise.data<float>();
  float* rs = routed.data<float>();
  int64_t rows = x.dim(0), cols = x.dim(1);
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelWork)
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t d = 0; d < cols; ++d) {
      int64_t i = t * cols + d;
      float f =
          kernels::jitter_factor(key, static_cast<uint64_t>((first_row + t) * cols + d), jitter);
      ns[i] = f;
      rs[i] = xs[i] * f;
    }
  }
}

void router_jitter_backward(const Tensor& noise, Tensor& dx) {
  const float* ns = noise.data<float>();
  float* ds = dx.data<float>();
  int64_t n = dx.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) ds[i] *= ns[i];
}

void router_softmax(const Tensor& logits, Tensor& probs, Tensor& lse) {
  int64_t rows = logits.dim(0), experts = logits.dim(1);
  const float* ls = logits.data<float>();
  float* ps = probs.data<float>();
  float* zs = lse.data<float>();
#pragma omp parallel for schedule(static) if (rows * experts >= kParallelWork)
  for (int64_t t = 0; t < rows; ++t)
    zs[t] = kernels::softmax_row(ls + t * experts, ps + t * experts, experts);
}

void router_topk(const Tensor& probs, int64_t k, bool normalize, const Tensor& bias, int64_t groups,
                 int64_t group_topk, Tensor& topk_idx, Tensor& topk_weight) {
  int64_t rows = probs.dim(0), experts = probs.dim(1);
  const float* ps = probs.data<float>();
  const float* bs = bias.defined() ? bias.data<float>() : nullptr;
  int32_t* is = topk_idx.data<int32_t>();
  float* ws = topk_weight.data<float>();
#pragma omp parallel for schedule(static) if (rows * experts * k >= kParallelWork)
  for (int64_t t = 0; t < rows; ++t)
    kernels::topk_row(ps + t * experts, experts, k, normalize, is + t * k, ws + t * k, bs, groups,
                      group_topk);
}

void router_backward(const Tensor& probs, const Tensor& lse, const Tensor& topk_idx,
                     const Tensor& dtopk_weight, bool normalize, const std::vector<float>& aux_coef,
                     float z_factor, Tensor& dlogits) {
  int64_t rows = probs.dim(0), experts = probs.dim(1);
  int64_t k = topk_idx.dim(1);
  const float* ps = probs.data<float>();
  const float* zs = lse.data<float>();
  const int32_t* is = topk_idx.data<int32_t>();
  const float* dws = dtopk_weight.data<float>();
  float* dl = dlogits.data<float>();
  const float* coef = aux_coef.data();
#pragma omp parallel for schedule(static) if (rows * experts >= kParallelWork)
  for (int64_t t = 0; t < rows; ++t)
    kernels::router_backward_row(ps + t * experts, experts, is + t * k, dws + t * k, k, normalize,
                                 coef, z_factor * zs[t], dl + t * experts);
}

void router_sigmoid(const Tensor& logits, Tensor& scores, Tensor& probs, Tensor& lse) {
  int64_t rows = logits.dim(0), experts = logits.dim(1);
  const float* ls = logits.data<float>();
  float* ss = scores.data<float>();
  float* ps = probs.data<float>();
  float* zs = lse.data<float>();
#pragma omp parallel for schedule(static) if (rows * experts >= kParallelWork)
  for (int64_t t = 0; t < rows; ++t)
    zs[t] = kernels::sigmoid_row(ls + t * experts, ss + t * experts, ps + t * experts, experts);
}

void router_backward_sigmoid(const Tensor& scores, const Tensor& logits, const Tensor& lse,
                             const Tensor& topk_idx, const Tensor& dtopk_weight, bool normalize,
                             const std::vector<float>& aux_coef, float z_factor, Tensor& dlogits) {
  int64_t rows = scores.dim(0), experts = scores.dim(1);
  int64_t k = topk_idx.dim(1);
  const float* ss = scores.data<float>();
  const float* ls = logits.data<float>();
  const float* zs = lse.data<float>();
  const int32_t* is = topk_idx.data<int32_t>();
  const float* dws = dtopk_weight.data<float>();
  float* dl = dlogits.data<float>();
  const float* coef = aux_coef.data();
#pragma omp parallel for schedule(static) if (rows * experts >= kParallelWork)
  for (int64_t t = 0; t < rows; ++t)
    kernels::router_backward_sigmoid_row(ss + t * experts, ls + t * experts, zs[t], experts,
                                         is + t * k, dws + t * k, k, normalize, coef,
                                         z_factor * zs[t], dl + t * experts);
}

void router_center_weight(const Tensor& w, const Tensor& center, Tensor& out) {
  const int64_t experts = w.dim(0), d = w.dim(1);
  const float* ws = w.data<float>();
  const float* c = center.data<float>();
  float* os = out.data<float>();
  const double cc = kernels::center_norm2(c, d);
  if (cc == 0) {
    if (os != ws) std::copy(ws, ws + experts * d, os);
    return;
  }
  std::vector<double> p(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e)
    p[static_cast<size_t>(e)] = kernels::center_projection(ws + e * d, c, d, cc);
  const double mean = kernels::center_mean(p.data(), experts);
  for (int64_t e = 0; e < experts; ++e) {
    const float k = kernels::center_shift(p[static_cast<size_t>(e)], mean);
    for (int64_t i = 0; i < d; ++i)
      os[e * d + i] = kernels::centred_element(ws[e * d + i], k, c[i]);
  }
}

void sigmoid(const Tensor& x, Tensor& y) {
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) ys[i] = kernels::sigmoid(xs[i]);
}

void sigmoid_backward(const Tensor& dy, const Tensor& y, Tensor& dx) {
  const float* g = dy.data<float>();
  const float* ys = y.data<float>();
  float* dxs = dx.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) dxs[i] = g[i] * ys[i] * (1.0f - ys[i]);
}

}  // namespace moe::cpu
