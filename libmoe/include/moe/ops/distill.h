// Knowledge-distillation loss on logits (moe-distill). Shape letters: N rows (tokens), V
// vocabulary.
#pragma once
#include <cstdint>

#include "moe/tensor.h"

namespace moe::ops {

struct DistillLossValue {
  double total = 0;  // ce_weight * ce + kd_weight * kd
  double ce = 0;     // mean cross-entropy of the student against the targets
  double kd = 0;     // mean T^2 * KL(softmax(teacher/T) || softmax(student/T))
  int64_t rows = 0;  // rows counted (target >= 0)
};

// Means over the rows whose target >= 0 (negative targets are ignored, as by the cross-entropy).
// student, teacher [N,V] f32 (same shape), targets [N] i32 (< V, else an Error naming the row),
// temperature > 0, weights >= 0. When dlogits is not null it must be [N,V] f32 and is written with
// scale * d(total)/d(student) (zero rows for ignored targets). Computed in fp32 per row with
// max-subtraction (backend/cpu/distill_loss.cpp, the row in kernels/distill_loss.h); the means are
// summed in double in row order, so the result does not depend on the thread count.
DistillLossValue distill_loss(const Tensor& student, const Tensor& teacher, const Tensor& targets,
                              float temperature, float ce_weight, float kd_weight,
                              Tensor* dlogits = nullptr, float scale = 1.0f);

}  // namespace moe::ops
