// Cross-entropy loss over logits rows. Shape letters: N rows, V vocabulary.
#include "moe/nn/loss.h"

#include "moe/ops/dense.h"

namespace moe::nn {

double cross_entropy(const Tensor& logits, const Tensor& targets, Tensor* dlogits, float scale,
                     Tensor* row_nll) {
  if (dlogits &&
      (!dlogits->defined() || dlogits->shape() != logits.shape() || dlogits->dtype() != DType::f32))
    *dlogits = Tensor::empty(logits.shape(), DType::f32, logits.device());
  const Shape rows{logits.ndim() >= 1 ? logits.dim(0) : 0};
  if (row_nll &&
      (!row_nll->defined() || row_nll->shape() != rows || row_nll->dtype() != DType::f32))
    *row_nll = Tensor::empty(rows, DType::f32, logits.device());
  return ops::cross_entropy(logits, targets, scale, dlogits, row_nll);
}

}  // namespace moe::nn
