// Knowledge-distillation loss (cross-entropy + T^2 KL to a teacher) with the student logits'
// gradient in the same pass: operand checks and the target count on the host, the per-row terms
// from Backend::distill, the means summed in double, in row order.
// Shapes: student / teacher / dlogits [N, V], targets [N].
#include <cmath>
#include <vector>

#include "core/backend.h"
#include "moe/ops/core.h"
#include "moe/ops/distill.h"
#include "moe/step_breakdown.h"
#include "ops/targets.h"

namespace moe::ops {

DistillLossValue distill_loss(const Tensor& student, const Tensor& teacher, const Tensor& targets,
                              float temperature, float ce_weight, float kd_weight, Tensor* dlogits,
                              float scale) {
  const PartScope part(StepPart::loss);
  const Device device = require_backend("distill_loss", {&student, &teacher, &targets, dlogits});
  MOE_CHECK(student.ndim() == 2, "distill_loss: student logits ", student.describe(),
            " are not 2-D [N,V]");
  student.expect_dtype(DType::f32, "distill_loss student logits");
  teacher.expect_shape(student.shape(), "distill_loss teacher logits");
  teacher.expect_dtype(DType::f32, "distill_loss teacher logits");
  const int64_t n = student.dim(0);
  targets.expect_shape({n}, "distill_loss targets");
  targets.expect_dtype(DType::i32, "distill_loss targets");
  MOE_CHECK(std::isfinite(temperature) && temperature > 0, "distill_loss: temperature ",
            temperature, " must be > 0");
  MOE_CHECK(ce_weight >= 0 && kd_weight >= 0, "distill_loss: weights ", ce_weight, ", ", kd_weight,
            " must be >= 0");
  if (dlogits) {
    dlogits->expect_shape(student.shape(), "distill_loss dlogits");
    dlogits->expect_dtype(DType::f32, "distill_loss dlogits");
  }
  const HostTargets checked = check_targets("distill_loss", targets, student);
  const int32_t* tg = checked.host.data<int32_t>();
  const int64_t counted = checked.counted;
  const float grad_scale = counted ? scale / static_cast<float>(counted) : 0.0f;

  const std::vector<kernels::DistillRow> rows = backend_for(device).distill.loss_rows(
      student, teacher, targets, temperature, ce_weight, kd_weight, dlogits, grad_scale);
  DistillLossValue value;
  value.rows = counted;
  if (!counted) return value;
  for (int64_t i = 0; i < n; ++i) {
    if (tg[i] < 0) continue;
    value.ce += rows[static_cast<size_t>(i)].ce;
    value.kd += rows[static_cast<size_t>(i)].kd;
  }
  value.ce /= static_cast<double>(counted);
  value.kd /= static_cast<double>(counted);
  value.total =
      static_cast<double>(ce_weight) * value.ce + static_cast<double>(kd_weight) * value.kd;
  return value;
}

}  // namespace moe::ops
