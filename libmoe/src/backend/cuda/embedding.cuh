// Kernel bodies of the embedding ops (grid.h), and the host-side table the backward sums by.
// Shapes: table / table_grad [rows, dim], ids [N] i32, out / dy [N, dim].
#pragma once
#include "backend/cuda/grid.h"

namespace moe::cuda {

// Host code: groups token positions by id with the CPU op's stable counting sort. `start` is
// scratch of rows + 1; `order` [n] receives the positions sorted by id (token order within an id);
// the touched ids, ascending, go to `touched` and their ranges in `order` to offsets[u] ..
// offsets[u + 1] (`touched` needs min(n, rows) slots, `offsets` one more). Ids must be in range.
// Returns the number of touched ids.
inline int64_t embedding_grad_table(const int32_t* ids, int64_t n, int64_t rows, int64_t* start,
                                    int64_t* order, int64_t* touched, int64_t* offsets) {
  for (int64_t r = 0; r <= rows; ++r) start[r] = 0;
  for (int64_t i = 0; i < n; ++i) ++start[ids[i] + 1];
  for (int64_t r = 0; r < rows; ++r) start[r + 1] += start[r];
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (start[r + 1] > start[r]) {
      touched[count] = r;
      offsets[count] = start[r];
      ++count;
    }
  }
  offsets[count] = n;
  for (int64_t i = 0; i < n; ++i) order[start[ids[i]]++] = i;  // start becomes a fill cursor
  return count;
}

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
