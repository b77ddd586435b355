// Rotary position embedding over [B*T, heads*hd] activations: operand checks, then
// Backend::dense.rope_apply (the backward is the inverse rotation); YaRN's settings -> RopeScaling.
#include <algorithm>
#include <cmath>

#include "core/backend.h"
#include "moe/error.h"
#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#include "moe/settings.h"
#include "moe/step_breakdown.h"

namespace moe::ops {

namespace {

void rope_apply(const char* op, const Tensor& x, int64_t batch, int64_t seq, int64_t heads,
                float theta, const RopeScaling& scaling, Tensor& y, int64_t position_offset,
                int64_t rotary_dim, bool inverse) {
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
  MOE_CHECK(scaling.factor >= 1.0f && scaling.ramp_width > 0.0f && scaling.attention_factor > 0.0f,
            op, ": YaRN factor ", scaling.factor, ", ramp width ", scaling.ramp_width,
            ", attention factor ", scaling.attention_factor);
  y.expect_shape(x.shape(), op);
  y.expect_dtype(DType::f32, op);
  backend_for(device).dense.rope_apply(x, batch, seq, heads, rotary_dim, theta, scaling, y,
                                       position_offset, inverse);
}

}  // namespace

void rope_forward(const Tensor& x, int64_t batch, int64_t seq, int64_t heads, float theta,
                  Tensor& y, int64_t position_offset, int64_t rotary_dim,
                  const RopeScaling& scaling) {
  const PartScope part(StepPart::elementwise);
  rope_apply("rope_forward", x, batch, seq, heads, theta, scaling, y, position_offset, rotary_dim,
             false);
}

void rope_backward(const Tensor& dy, int64_t batch, int64_t seq, int64_t heads, float theta,
                   Tensor& dx, int64_t position_offset, int64_t rotary_dim,
                   const RopeScaling& scaling) {
  const PartScope part(StepPart::elementwise);
  rope_apply("rope_backward", dy, batch, seq, heads, theta, scaling, dx, position_offset,
             rotary_dim, true);
}

double yarn_mscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

// The pair index (fractional) whose wavelength fits `rotations` turns into `context` positions:
// inverting 2 pi theta^(2i/rd) = context / rotations for i (the YaRN paper's eq. 17, in pairs).
static double correction_pair(double rotations, int64_t rotary_dim, double theta, double context) {
  return double(rotary_dim) * std::log(context / (rotations * 2.0 * 3.141592653589793)) /
         (2.0 * std::log(theta));
}

// A YaRN setting outside its range, named by moe-train's flag and by its key as an HF config's
// rope_scaling names it: import-hf's user has the key, not the flag.
static void require_yarn(double got, bool in_range, Setting setting, const char* key,
                         const char* range) {
  if (!in_range || !std::isfinite(got))
    throw UsageError(str(flag_for(setting), " must be ", range, " (got ", got, "): YaRN's \"", key,
                         "\", as an HF config names it"));
}

RopeScaling yarn_scaling(const YarnSettings& yarn, double theta, int64_t rotary_dim) {
  require_yarn(yarn.factor, yarn.factor >= 1.0, Setting::rope_factor, "factor", ">= 1");
  require_yarn(yarn.original_ctx, yarn.original_ctx >= 1.0, Setting::original_max_positions,
               "original_max_position_embeddings", ">= 1 position");
  require_yarn(yarn.beta_fast, yarn.beta_fast > 0, Setting::beta_fast, "beta_fast", "> 0");
  require_yarn(yarn.beta_slow, yarn.beta_slow > 0, Setting::beta_slow, "beta_slow", "> 0");
  require_yarn(yarn.mscale, yarn.mscale >= 0, Setting::mscale, "mscale", ">= 0 (0 = absent)");
  require_yarn(yarn.mscale_all_dim, yarn.mscale_all_dim >= 0, Setting::mscale_all_dim,
               "mscale_all_dim", ">= 0 (0 = absent)");
  MOE_USAGE_CHECK(yarn.attention_factor >= 0 && std::isfinite(yarn.attention_factor),
                  "YaRN's \"attention_factor\" must be >= 0 (0 = derived; got ",
                  yarn.attention_factor, ")");
  MOE_USAGE_CHECK(theta > 1.0, "YaRN needs ", flag_for(Setting::rope_theta), " > 1 (got ", theta,
                  "): its correction range divides by ln theta");
  MOE_USAGE_CHECK(rotary_dim >= 2, "YaRN needs a rotary dim >= 2 (got ", rotary_dim, ")");
  double low = correction_pair(yarn.beta_fast, rotary_dim, theta, yarn.original_ctx);
  double high = correction_pair(yarn.beta_slow, rotary_dim, theta, yarn.original_ctx);
  if (yarn.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, double(rotary_dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  RopeScaling s;
  s.factor = static_cast<float>(yarn.factor);
  s.ramp_low = static_cast<float>(low);
  s.ramp_width = static_cast<float>(high - low);
  double attention = yarn.attention_factor;
  if (attention == 0)
    attention =
        yarn.mscale > 0 && yarn.mscale_all_dim > 0
            ? yarn_mscale(yarn.factor, yarn.mscale) / yarn_mscale(yarn.factor, yarn.mscale_all_dim)
            : yarn_mscale(yarn.factor);
  s.attention_factor = static_cast<float>(attention);
  MOE_USAGE_CHECK(s.ramp_width > 0.0f, "YaRN's correction range is empty: beta_fast ",
                  yarn.beta_fast, " and beta_slow ", yarn.beta_slow, " over ", yarn.original_ctx,
                  " positions give pairs ", low, " .. ", high);
  return s;
}

}  // namespace moe::ops
