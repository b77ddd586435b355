// LayerNorm / RMSNorm: operand checks, then the device's loops (Backend::dense).
// Shapes: x, y, dy, dx [N, D]; weight, bias [D]; mean, rstd [N].
#include "core/backend.h"
#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#include "moe/step_breakdown.h"

namespace moe::ops {

namespace {

int64_t check_rows(const Tensor& x, const char* op) {
  MOE_CHECK(x.ndim() == 2, op, ": input ", x.describe(), " is not 2-D [N,D]");
  x.expect_dtype(DType::f32, op);
  return x.dim(0);
}

void check_f32(const Tensor& t, const Shape& shape, const char* what) {
  t.expect_shape(shape, what);
  t.expect_dtype(DType::f32, what);
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       Tensor& y, Tensor* mean, Tensor* rstd) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("layernorm_forward", {&x, &weight, &bias, &y, mean, rstd});
  const int64_t n = check_rows(x, "layernorm_forward"), d = x.dim(1);
  check_f32(weight, {d}, "layernorm_forward weight");
  check_f32(bias, {d}, "layernorm_forward bias");
  check_f32(y, {n, d}, "layernorm_forward output");
  if (mean) check_f32(*mean, {n}, "layernorm_forward mean");
  if (rstd) check_f32(*rstd, {n}, "layernorm_forward rstd");
  backend_for(device).dense.layernorm_forward(x, weight, bias, eps, y, mean, rstd);
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor* dbias) {
  const PartScope part(StepPart::elementwise);
  const Device device =
      require_backend("layernorm_backward", {&dy, &x, &weight, &mean, &rstd, &dx, &dweight, dbias});
  const int64_t n = check_rows(x, "layernorm_backward"), d = x.dim(1);
  check_f32(dy, {n, d}, "layernorm_backward dy");
  check_f32(weight, {d}, "layernorm_backward weight");
  check_f32(mean, {n}, "layernorm_backward mean");
  check_f32(rstd, {n}, "layernorm_backward rstd");
  check_f32(dx, {n, d}, "layernorm_backward dx");
  check_f32(dweight, {d}, "layernorm_backward weight gradient");
  if (dbias) check_f32(*dbias, {d}, "layernorm_backward bias gradient");
  backend_for(device).dense.layernorm_backward(dy, x, weight, mean, rstd, dx, dweight, dbias);
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor* rstd) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("rmsnorm_forward", {&x, &weight, &y, rstd});
  const int64_t n = check_rows(x, "rmsnorm_forward"), d = x.dim(1);
  check_f32(weight, {d}, "rmsnorm_forward weight");
  check_f32(y, {n, d}, "rmsnorm_forward output");
  if (rstd) check_f32(*rstd, {n}, "rmsnorm_forward rstd");
  backend_for(device).dense.rmsnorm_forward(x, weight, eps, y, rstd);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      Tensor& dx, Tensor& dweight) {
  const PartScope part(StepPart::elementwise);
  const Device device =
      require_backend("rmsnorm_backward", {&dy, &x, &weight, &rstd, &dx, &dweight});
  const int64_t n = check_rows(x, "rmsnorm_backward"), d = x.dim(1);
  check_f32(dy, {n, d}, "rmsnorm_backward dy");
  check_f32(weight, {d}, "rmsnorm_backward weight");
  check_f32(rstd, {n}, "rmsnorm_backward rstd");
  check_f32(dx, {n, d}, "rmsnorm_backward dx");
  check_f32(dweight, {d}, "rmsnorm_backward weight gradient");
  backend_for(device).dense.rmsnorm_backward(dy, x, weight, rstd, dx, dweight);
}

}  // namespace moe::ops
