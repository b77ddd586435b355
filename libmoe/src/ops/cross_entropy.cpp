// Mean cross-entropy over non-ignored rows: operand checks and the target count on the host, the
// per-row nll (and logits gradient) from Backend::dense, the mean in double, in row order.
// Shapes: logits / dlogits [N, V], targets / row_nll [N].
#include "core/backend.h"
#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#include "moe/step_breakdown.h"
#include "ops/targets.h"

namespace moe::ops {

double cross_entropy(const Tensor& logits, const Tensor& targets, float scale, Tensor* dlogits,
                     Tensor* row_nll) {
  const PartScope part(StepPart::loss);
  const Device device = require_backend("cross_entropy", {&logits, &targets, dlogits, row_nll});
  MOE_CHECK(logits.ndim() == 2, "cross_entropy: logits ", logits.describe(), " are not 2-D [N,V]");
  logits.expect_dtype(DType::f32, "cross_entropy logits");
  const int64_t n = logits.dim(0);
  targets.expect_shape({n}, "cross_entropy targets");
  targets.expect_dtype(DType::i32, "cross_entropy targets");
  if (dlogits) {
    dlogits->expect_shape(logits.shape(), "cross_entropy dlogits");
    dlogits->expect_dtype(DType::f32, "cross_entropy dlogits");
  }
  if (row_nll) {
    row_nll->expect_shape({n}, "cross_entropy row_nll");
    row_nll->expect_dtype(DType::f32, "cross_entropy row_nll");
  }
  const HostTargets checked = check_targets("cross_entropy", targets, logits);
  const int32_t* tg = checked.host.data<int32_t>();
  const int64_t counted = checked.counted;
  const float grad_scale = counted ? scale / static_cast<float>(counted) : 0.0f;

  Tensor nll = row_nll ? *row_nll : Tensor::empty({n}, DType::f32, device);
  backend_for(device).dense.cross_entropy_rows(logits, targets, grad_scale, dlogits, nll);
  // The mean in double, in row order, on the host.
  const Tensor host_nll = nll.to(Device{});
  const float* rows = host_nll.data<float>();
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i)
    if (tg[i] >= 0) sum += rows[i];
  return counted ? sum / static_cast<double>(counted) : 0.0;
}

}  // namespace moe::ops
