// CUDA router ops: jitter, softmax or sigmoid scores, top-k and the router row backward, a centred
// router's weight, and the shared expert gate's sigmoid. Loads and the fp64 aux / z
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

void router_topk(const Tensor& probs, int64_t k, bool normalize, const Tensor& bias, int64_t groups,
                 int64_t group_topk, Tensor& topk_idx, Tensor& topk_weight) {
  const int64_t rows = probs.dim(0), experts = probs.dim(1);
  if (rows == 0) return;
  launch<body::RouterTopk>(launch_shape(rows), stream_of(probs), probs.data<float>(), rows, experts,
                           k, normalize, topk_idx.data<int32_t>(), topk_weight.data<float>(),
                           bias.defined() ? bias.data<float>() : nullptr, groups, group_topk);
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

void router_center_weight(const Tensor& w, const Tensor& center, Tensor& out) {
  const int64_t experts = w.dim(0), d = w.dim(1);
  if (experts == 0) return;
  // E + 1 doubles (the projections, then |c|^2) in an 8-byte tensor; k [E] in f32.
  Tensor scratch = Tensor::empty({experts + 1}, DType::i64, w.device());
  Tensor k = Tensor::empty({experts}, DType::f32, w.device());
  auto* s = reinterpret_cast<double*>(scratch.data<int64_t>());
  const cudaStream_t stream = stream_of(out);
  launch<body::RouterCenterProject>(launch_shape(experts + 1), stream, w.data<float>(),
                                    center.data<float>(), experts, d, s);
  launch<body::RouterCenterShift>(launch_shape(experts), stream, static_cast<const double*>(s),
                                  experts, k.data<float>());
  launch<body::RouterCenterApply>(launch_shape(experts * d), stream, w.data<float>(),
                                  center.data<float>(), static_cast<const double*>(s),
                                  static_cast<const float*>(k.data<float>()), experts, d,
                                  out.data<float>());
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
