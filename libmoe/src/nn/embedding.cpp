// Embedding table lookup. Shape letters: N tokens.
#include "moe/nn/embedding.h"

#include "moe/ops/dense.h"

namespace moe::nn {

Embedding::Embedding(ParamSet& ps, const std::string& name, int64_t rows, int64_t dim,
                     float init_std) {
  MOE_USAGE_CHECK(rows > 0 && dim > 0, "embedding ", name, ": rows ", rows, " and dim ", dim,
                  " must be positive");
  table_ = &ps.add(name, {rows, dim}, Init::normal(init_std), /*decay=*/false);
}

Tensor Embedding::forward(const Tensor& ids) const {
  const Tensor& table = table_->w();
  Tensor out = Tensor::empty({ids.numel(), table.dim(1)}, DType::f32, table.device());
  ops::embedding_forward(table, ids, out);
  return out;
}

void Embedding::backward(const Tensor& dy, const Tensor& ids) {
  ops::embedding_backward(dy, ids, table_->grad);
}

}  // namespace moe::nn
