// Rotary position embedding over [B*T, heads*hd] activations: operand checks, then
// Backend::dense.rope_apply (the backward is the inverse rotation).
#include "core/backend.h"
#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#include "moe/step_breakdown.h"

namespace moe::ops {

namespace {

void rope_apply(const char* op, const Tensor& x, int64_t batch, int64_t seq, int64_t heads,
                float theta, Tensor& y, int64_t position_offset, int64_t rotary_dim, bool inverse) {
  const Device device = require_backend(op, {&x, &y});
  MOE_CHECK(x.ndim() == 2, op, ": input ", x.describe(), " is not 2-D [B*T, H*hd]");
  x.expect_dtype(DType::f32, op);
  MOE_CHECK(batch >= 0 && seq >= 0 && heads > 0 && x.dim(0) == batch * seq && x.dim(1) % heads == 0,
            op, ": input ", x.describe(), " does not match batch ", batch, ", seq ", seq,
            ", heads ", heads);
  const int64_t width = x.dim(1), head_dim = width / heads;
  MOE_CHECK(head_dim % 2 == 0, op, ": head dim ", head_dim, " of ", x.describe(), " is odd");
  if (rotary_dim == 0) rotary_dim = head_dim;
  MOE_CHECK(rotary_dim >= 2 && rotary_dim <= head_dim && rotary_dim % 2 == 0, op, ": rotary dim ",
            rotary_dim, " must be even and within the head dim ", head_dim);
  MOE_CHECK(theta > 0.0f && position_offset >= 0, op, ": theta ", theta, ", position offset ",
            position_offset);
  y.expect_shape(x.shape(), op);
  y.expect_dtype(DType::f32, op);
  backend_for(device).dense.rope_apply(x, batch, seq, heads, rotary_dim, theta, y, position_offset,
                                       inverse);
}

}  // namespace

void rope_forward(const Tensor& x, int64_t batch, int64_t seq, int64_t heads, float theta,
                  Tensor& y, int64_t position_offset, int64_t rotary_dim) {
  const PartScope part(StepPart::elementwise);
  rope_apply("rope_forward", x, batch, seq, heads, theta, y, position_offset, rotary_dim, false);
}

void rope_backward(const Tensor& dy, int64_t batch, int64_t seq, int64_t heads, float theta,
                   Tensor& dx, int64_t position_offset, int64_t rotary_dim) {
  const PartScope part(StepPart::elementwise);
  rope_apply("rope_backward", dy, batch, seq, heads, theta, dx, position_offset, rotary_dim, true);
}

}  // namespace moe::ops
