// Token positions grouped by id, for the embedding backward of both backends: each touched id then
// sums its tokens' rows in token order (one thread per row on the CPU, per (id, column) on CUDA),
// so the gradient does not depend on how the work is split. Host code.
#pragma once
#include <cstdint>
#include <vector>

namespace moe::backend {

struct EmbeddingOrder {
  std::vector<int64_t> order;    // [n] token positions, sorted by id (stable: token order)
  std::vector<int64_t> touched;  // ids with at least one token, ascending
  std::vector<int64_t> offsets;  // [touched + 1]: touched[u]'s tokens are order[offsets[u]..[u+1])
};

// Stable counting sort of n ids, each in [0, rows) (the caller checks).
inline EmbeddingOrder embedding_order(const int32_t* ids, int64_t n, int64_t rows) {
  std::vector<int64_t> start(static_cast<size_t>(rows) + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++start[ids[i] + 1];
  for (int64_t r = 0; r < rows; ++r) start[r + 1] += start[r];
  EmbeddingOrder g;
  for (int64_t r = 0; r < rows; ++r) {
    if (start[r + 1] > start[r]) {
      g.touched.push_back(r);
      g.offsets.push_back(start[r]);
    }
  }
  g.offsets.push_back(n);
  g.order.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) g.order[start[ids[i]]++] = i;  // start becomes a fill cursor
  return g;
}

}  // namespace moe::backend
