// CPU knowledge-distillation loss rows (cross-entropy + T^2 KL to a teacher) with the student
// logits' gradient in the same pass, rows in parallel. Shapes: student / teacher / dlogits [N, V],
// targets [N].
#include "kernels/distill_loss.h"

#include <vector>

#include "backend/cpu/backend.h"
#include "core/parallel.h"

namespace moe::cpu {

std::vector<kernels::DistillRow> distill_loss_rows(const Tensor& student, const Tensor& teacher,
                                                   const Tensor& targets, float temperature,
                                                   float ce_weight, float kd_weight,
                                                   Tensor* dlogits, float grad_scale) {
  const int64_t n = student.dim(0), vocab = student.dim(1);
  const int32_t* tg = targets.data<int32_t>();
  std::vector<kernels::DistillRow> rows(static_cast<size_t>(n));
  const float* s = student.data<float>();
  const float* t = teacher.data<float>();
  float* dxs = dlogits ? dlogits->data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (n * vocab >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    float* dx_row = dxs ? dxs + i * vocab : nullptr;
    if (tg[i] < 0) {
      rows[static_cast<size_t>(i)] = {0.0f, 0.0f};
      if (dx_row)
        for (int64_t j = 0; j < vocab; ++j) dx_row[j] = 0.0f;
      continue;
    }
    rows[static_cast<size_t>(i)] =
        kernels::distill_loss_row(s + i * vocab, t + i * vocab, vocab, tg[i], temperature,
                                  ce_weight, kd_weight, dx_row, grad_scale);
  }
  return rows;
}

}  // namespace moe::cpu
