// Kernel bodies of the optimizer (grid.h): the AdamW update and the gradient-clipping scale, one
// thread per element.
#pragma once
#include "backend/cuda/grid.h"
#include "kernels/adamw.h"

namespace moe::cuda::body {

struct AdamWUpdate {
  MOE_HD static void run(Thread th, float* master, float* m, float* v, const float* grad,
                         kernels::AdamWScalars scalars, int64_t n) {
    MOE_GRID_LOOP(i, n, th) { kernels::adamw_update(master[i], m[i], v[i], grad[i], scalars); }
  }
};

struct ScaleInPlace {
  MOE_HD static void run(Thread th, float* x, float scale, int64_t n) {
    MOE_GRID_LOOP(i, n, th) { x[i] *= scale; }
  }
};

}  // namespace moe::cuda::body
