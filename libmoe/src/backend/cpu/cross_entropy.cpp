// CPU cross-entropy rows: each row's nll and logits gradient in one pass, rows in parallel.
// Shapes: logits / dlogits [N, V], targets / nll [N].
#include "kernels/cross_entropy.h"

#include "backend/cpu/backend.h"
#include "core/parallel.h"

namespace moe::cpu {

void cross_entropy_rows(const Tensor& logits, const Tensor& targets, float grad_scale,
                        Tensor* dlogits, Tensor& nll) {
  const int64_t n = logits.dim(0), vocab = logits.dim(1);
  const int32_t* tg = targets.data<int32_t>();
  const float* xs = logits.data<float>();
  float* dxs = dlogits ? dlogits->data<float>() : nullptr;
  float* out = nll.data<float>();
#pragma omp parallel for schedule(static) if (n * vocab >= kParallelWork)
  for (int64_t i = 0; i < n; ++i)
    out[i] = kernels::cross_entropy_target_row(xs + i * vocab, vocab, tg[i],
                                               dxs ? dxs + i * vocab : nullptr, grad_scale);
}

}  // namespace moe::cpu
