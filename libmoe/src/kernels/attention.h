// Kernel bodies of causal attention, one score row at a time: the softmax over the keys a query
// sees and its backward. The products around them are GEMMs (BLAS on the CPU, cuBLAS on CUDA).
// A row holds `keys` scores; the query sees the first `visible` of them (causal mask).
#pragma once
#include "kernels/common.h"
#include "kernels/softmax.h"

namespace moe::kernels {

// p [keys]: softmax in place over p[0..visible), exact zeros after.
MOE_HD void causal_softmax_row(float* p, int64_t visible, int64_t keys) {
  softmax_row(p, p, visible);
  for (int64_t j = visible; j < keys; ++j) p[j] = 0.0f;
}

// d [keys] holds d loss / d probs of the row (dctx V^T); replaced by d loss / d scores before the
// scale: scale * softmax_backward(p, d) over the visible keys, zeros after.
MOE_HD void causal_softmax_backward_row(const float* p, float* d, int64_t visible, int64_t keys,
                                        float scale) {
  softmax_backward_row(p, d, d, visible);
  for (int64_t j = 0; j < visible; ++j) d[j] *= scale;
  for (int64_t j = visible; j < keys; ++j) d[j] = 0.0f;
}

}  // namespace moe::kernels
