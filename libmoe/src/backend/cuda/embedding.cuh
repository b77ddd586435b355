// Kernel bodies of the embedding ops (grid.h); the backward sums by backend/embedding_order.h.
// Shapes: table / table_grad [rows, dim], ids [N] i32, out / dy [N, dim].
#pragma once
#include "backend/cuda/grid.h"

namespace moe::cuda {

namespace body {

// One thread per output element.
struct EmbeddingGather {
  MOE_HD static void run(Thread th, const float* table, const int32_t* ids, float* out, int64_t n,
                         int64_t dim) {
    MOE_GRID_LOOP(e, n * dim, th) {
      const int64_t i = e / dim, j = e - i * dim;
      out[e] = table[static_cast<int64_t>(ids[i]) * dim + j];
    }
  }
};

// One thread per (touched id, column): adds the id's dy rows in token order, into table_grad.
struct EmbeddingScatterAdd {
  MOE_HD static void run(Thread th, const float* dy, const int64_t* order, const int64_t* touched,
                         const int64_t* offsets, float* table_grad, int64_t count, int64_t dim) {
    MOE_GRID_LOOP(e, count * dim, th) {
      const int64_t u = e / dim, j = e - u * dim;
      float* dst = table_grad + touched[u] * dim + j;
      float acc = *dst;
      for (int64_t s = offsets[u]; s < offsets[u + 1]; ++s) acc += dy[order[s] * dim + j];
      *dst = acc;
    }
  }
};

}  // namespace body
}  // namespace moe::cuda
