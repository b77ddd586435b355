// Lookup table: out[N,dim] = table[ids[n]]. Shape letters: N tokens (ids may be [N] or [B,T]).
#pragma once
#include <string>

#include "moe/param.h"

namespace moe::nn {

class Embedding {
 public:
  // Param named exactly `name`, [rows, dim], normal(init_std), no weight decay (embedding rows
  // are touched sparsely; decaying them every step would shrink rare tokens).
  Embedding(ParamSet& ps, const std::string& name, int64_t rows, int64_t dim, float init_std);
  // ids i32 -> [ids.numel(), dim]; an id out of range throws naming the id and the table.
  Tensor forward(const Tensor& ids) const;
  // table.grad[ids[n]] += dy[n], deterministic (rows summed in token order, no atomics).
  void backward(const Tensor& dy, const Tensor& ids);
  Param& table() const { return *table_; }

 private:
  Param* table_;
};

}  // namespace moe::nn
