// CUDA cross-entropy (body in cross_entropy.cuh). Targets are checked on a host copy; the per-row
// nll comes back to the host, where the mean is summed in double in row order as on the CPU.
#include <vector>

#include "backend/cuda/cross_entropy.cuh"
#include "backend/cuda/dense_ops.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/runtime.h"
#include "moe/error.h"

namespace moe::cuda {

double cross_entropy(const Tensor& logits, const Tensor& targets, float scale, Tensor* dlogits,
                     Tensor* row_nll) {
  const int64_t n = logits.dim(0), vocab = logits.dim(1);
  const int device = logits.device().index;
  std::vector<int32_t> tg(static_cast<size_t>(n));
  if (n > 0) copy_bytes(tg.data(), -1, targets.raw(), device, sizeof(int32_t) * n);
  // The CPU op's checks and messages (backend/cpu/cross_entropy.cpp).
  int64_t counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    MOE_CHECK(tg[i] < vocab, "cross_entropy: target ", tg[i], " at row ", i, " of ",
              targets.describe(), " is out of range for logits ", logits.describe());
    if (tg[i] >= 0) ++counted;
  }
  MOE_CHECK(vocab > 0 || counted == 0, "cross_entropy: logits ", logits.describe(),
            " have no classes");
  if (n == 0) return 0.0;
  const float grad_scale = counted ? scale / static_cast<float>(counted) : 0.0f;

  Tensor scratch;
  if (!row_nll) scratch = Tensor::empty({n}, DType::f32, logits.device());
  float* nll = row_nll ? row_nll->data<float>() : scratch.data<float>();
  float* dx = dlogits ? dlogits->data<float>() : nullptr;
  use_device(device);
  launch<body::CrossEntropyRows>(launch_shape(n), current_stream(device), logits.data<float>(),
                                 targets.data<int32_t>(), dx, nll, n, vocab, grad_scale);
  std::vector<float> host_nll(static_cast<size_t>(n));
  copy_bytes(host_nll.data(), -1, nll, device, sizeof(float) * n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i)
    if (tg[i] >= 0) sum += host_nll[i];
  return counted ? sum / static_cast<double>(counted) : 0.0;
}

}  // namespace moe::cuda
