// Kernel body of the distillation loss (grid.h): one thread per row of [N, V] logits, calling the
// kernels/distill_loss.h row; the per-row (ce, kd) go to a buffer the host sums in row order.
#pragma once
#include "backend/cuda/grid.h"
#include "kernels/distill_loss.h"

namespace moe::cuda::body {

// rows_out[i] = the row's (ce, kd), {0, 0} and a zero dx row (when dx is not null) where
// target < 0. Targets are < V (checked on the host).
struct DistillLossRows {
  MOE_HD static void run(Thread th, const float* student, const float* teacher,
                         const int32_t* targets, int64_t rows, int64_t vocab, float temperature,
                         float ce_weight, float kd_weight, float* dx, float grad_scale,
                         kernels::DistillRow* rows_out) {
    MOE_GRID_LOOP(i, rows, th) {
      float* dx_row = dx ? dx + i * vocab : nullptr;
      if (targets[i] < 0) {
        rows_out[i] = {0.0f, 0.0f};
        if (dx_row)
          for (int64_t j = 0; j < vocab; ++j) dx_row[j] = 0.0f;
        continue;
      }
      rows_out[i] =
          kernels::distill_loss_row(student + i * vocab, teacher + i * vocab, vocab, targets[i],
                                    temperature, ce_weight, kd_weight, dx_row, grad_scale);
    }
  }
};

}  // namespace moe::cuda::body
