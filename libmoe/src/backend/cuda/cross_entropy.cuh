// Kernel body of cross-entropy (grid.h, kernels/cross_entropy.h): one thread per row.
// Shapes: logits / dlogits [N, V], targets / nll [N].
#pragma once
#include "backend/cuda/grid.h"
#include "kernels/cross_entropy.h"

namespace moe::cuda::body {

// nll[i] = the row's nll (0 when target < 0); dlogits (may be null) = grad_scale * (softmax -
// onehot), zero on ignored rows. Targets are checked (< vocab) by the caller.
struct CrossEntropyRows {
  MOE_HD static void run(Thread th, const float* logits, const int32_t* targets, float* dlogits,
                         float* nll, int64_t n, int64_t vocab, float grad_scale) {
    MOE_GRID_LOOP(i, n, th) {
      nll[i] =
          kernels::cross_entropy_target_row(logits + i * vocab, vocab, targets[i],
                                            dlogits ? dlogits + i * vocab : nullptr, grad_scale);
    }
  }
};

}  // namespace moe::cuda::body
