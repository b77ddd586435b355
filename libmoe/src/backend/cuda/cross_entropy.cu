// CUDA cross-entropy rows (body in cross_entropy.cuh); the device-neutral op checks the targets
// and sums the mean on the host.
#include "backend/cuda/cross_entropy.cuh"
#include "backend/cuda/dense_ops.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/runtime.h"

namespace moe::cuda {

void cross_entropy_rows(const Tensor& logits, const Tensor& targets, float grad_scale,
                        Tensor* dlogits, Tensor& nll) {
  const int64_t n = logits.dim(0), vocab = logits.dim(1);
  if (n == 0) return;
  launch<body::CrossEntropyRows>(
      launch_shape(n), stream_of(logits), logits.data<float>(), targets.data<int32_t>(),
      dlogits ? dlogits->data<float>() : nullptr, nll.data<float>(), n, vocab, grad_scale);
}

}  // namespace moe::cuda
