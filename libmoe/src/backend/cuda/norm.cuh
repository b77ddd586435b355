// Kernel bodies of LayerNorm / RMSNorm (grid.h): one thread per row for y and dx (the row bodies
// of kernels/norm.h), one thread per column over rows in order for the parameter gradients.
// Shapes: x, y, dy, dx [N, D]; weight, bias [D]; mean, rstd [N].
#pragma once
#include "backend/cuda/grid.h"
#include "kernels/norm.h"

namespace moe::cuda::body {

// mean / rstd may be null.
struct LayerNormRows {
  MOE_HD static void run(Thread th, const float* x, const float* w, const float* b, float* y,
                         float* mean, float* rstd, int64_t n, int64_t d, float eps) {
    MOE_GRID_LOOP(i, n, th) {
      float m, r;
      kernels::layernorm_row(x + i * d, w, b, y + i * d, d, eps, &m, &r);
      if (mean) mean[i] = m;
      if (rstd) rstd[i] = r;
    }
  }
};

struct LayerNormRowsBackward {
  MOE_HD static void run(Thread th, const float* dy, const float* x, const float* w,
                         const float* mean, const float* rstd, float* dx, int64_t n, int64_t d) {
    MOE_GRID_LOOP(i, n, th) {
      kernels::layernorm_row_backward(dy + i * d, x + i * d, w, mean[i], rstd[i], dx + i * d, d);
    }
  }
};

// rstd may be null.
struct RmsNormRows {
  MOE_HD static void run(Thread th, const float* x, const float* w, float* y, float* rstd,
                         int64_t n, int64_t d, float eps) {
    MOE_GRID_LOOP(i, n, th) {
      float r;
      kernels::rmsnorm_row(x + i * d, w, y + i * d, d, eps, &r);
      if (rstd) rstd[i] = r;
    }
  }
};

struct RmsNormRowsBackward {
  MOE_HD static void run(Thread th, const float* dy, const float* x, const float* w,
                         const float* rstd, float* dx, int64_t n, int64_t d) {
    MOE_GRID_LOOP(i, n, th) {
      kernels::rmsnorm_row_backward(dy + i * d, x + i * d, w, rstd[i], dx + i * d, d);
    }
  }
};

// dw (and db when not null) += per-row contributions; one thread per column, rows in order (the
// CPU op's order). mean null for RMSNorm.
struct NormParamGrad {
  MOE_HD static void run(Thread th, const float* dy, const float* x, const float* mean,
                         const float* rstd, float* dw, float* db, int64_t n, int64_t d) {
    MOE_GRID_LOOP(j, d, th) {
      for (int64_t i = 0; i < n; ++i)
        kernels::norm_param_grad_row(dy + i * d, x + i * d, mean ? mean[i] : 0.0f, rstd[i], j,
                                     j + 1, dw, db);
    }
  }
};

}  // namespace moe::cuda::body
