// CUDA router ops: jitter, softmax or sigmoid scores, top-k and the router row backward, and the
// shared expert gate's sigmoid. Loads and the fp64 aux / z
// losses are computed on the host by the CPU op from a device-to-host copy (router_ops.cpp).
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_ops.h"
#include "backend/cuda/router.cuh"
#include "backend/cuda/runtime.h"

namespace moe::cuda {

void router_jitter(const Tensor& x, float jitter, uint64_t key, Tensor& noise, Tensor& routed,
                   int64_t first_row) {
  const int64_t n = x.numel();
  if (n == 0) return;
  launch<body::RouterJitter>(launch_shape(n), stream_of(x), x.data<float>(), jitter, key,
                             noise.data<float>(), routed.data<float>(), first_row, x.dim(1), n);
}

void router_jitter_backward(const Tensor& noise, Tensor& dx) {
  const int64_t n = dx.numel();
  if (n == 0) return;
  launch<body::RouterJitterBackward>(launch_shape(n), stream_of(dx), noise.data<float>(),
                                     dx.data<float>(), n);
}

void router_softmax(const Tensor& logits, Tensor& probs, Tensor& lse) {
  const int64_t rows = logits.dim(0), experts = logits.dim(1);
  if (rows == 0) return;
  launch<body::RouterSoftmax>(launch_shape(rows), stream_of(logits), logits.data<float>(),
                              probs.data<float>(), lse.data<float>(), rows, experts);
}

void router_topk(const Tensor& probs, int64_t k, bool normalize, const Tensor& bias,
                 Tensor& topk_idx, Tensor& topk_weight) {
  const int64_t rows = probs.dim(0), experts = probs.dim(1);
  if (rows == 0) return;
  launch<body::RouterTopk>(launch_shape(rows), stream_of(probs), probs.data<float>(), rows, experts,
                           k, normalize, topk_idx.data<int32_t>(), topk_weight.data<float>(),
                           bias.defined() ? bias.data<float>() : nullptr);
}

void router_backward(const Tensor& probs, const Tensor& lse, const Tensor& topk_idx,
                     const Tensor& dtopk_weight, bool normalize, const std::vector<float>& aux_coef,
                     float z_factor, Tensor& dlogits) {
  const int64_t rows = probs.dim(0), experts = probs.dim(1), k = topk_idx.dim(1);
  if (rows == 0) return;
  const Tensor coef =
      Tensor::from_vector({static_cast<int64_t>(aux_coef.size())}, aux_coef).to(probs.device());
  launch<body::RouterBackward>(launch_shape(rows), stream_of(probs), probs.data<float>(),
                               lse.data<float>(), topk_idx.data<int32_t>(),
                               dtopk_weight.data<float>(), rows, experts, k, normalize,
                               coef.data<float>(), z_factor, dlogits.data<float>());
}

void router_sigmoid(const Tensor& logits, Tensor& scores, Tensor& probs, Tensor& lse) {
  const int64_t rows = logits.dim(0), experts = logits.dim(1);
  if (rows == 0) return;
  launch<body::RouterSigmoid>(launch_shape(rows), stream_of(logits), logits.data<float>(),
                              scores.data<float>(), probs.data<float>(), lse.data<float>(), rows,
                              experts);
}

void router_backward_sigmoid(const Tensor& scores, const Tensor& logits, const Tensor& lse,
                             const Tensor& topk_idx, const Tensor& dtopk_weight, bool normalize,
                             const std::vector<float>& aux_coef, float z_factor, Tensor& dlogits) {
  const int64_t rows = scores.dim(0), experts = scores.dim(1), k = topk_idx.dim(1);
  if (rows == 0) return;
  const Tensor coef =
      Tensor::from_vector({static_cast<int64_t>(aux_coef.size())}, aux_coef).to(scores.device());
  launch<body::RouterBackwardSigmoid>(
      launch_shape(rows), stream_of(scores), scores.data<float>(), logits.data<float>(),
      lse.data<float>(), topk_idx.data<int32_t>(), dtopk_weight.data<float>(), rows, experts, k,
      normalize, coef.data<float>(), z_factor, dlogits.data<float>());
}

void sigmoid(const Tensor& x, Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  launch<body::Sigmoid>(launch_shape(n), stream_of(y), x.data<float>(), y.data<float>(), n);
}

void sigmoid_backward(const Tensor& dy, const Tensor& y, Tensor& dx) {
  const int64_t n = y.numel();
  if (n == 0) return;
  launch<body::SigmoidBackward>(launch_shape(n), stream_of(dx), dy.data<float>(), y.data<float>(),
                                dx.data<float>(), n);
}

}  // namespace moe::cuda
