// Bias add / bias gradient (Linear) and the GELU / SwiGLU activations (MLP): operand checks, then
// Backend::dense. Shapes: y, dy [N, C]; bias [C]; activations elementwise on any shape.
#include "core/backend.h"
#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#include "moe/step_breakdown.h"

namespace moe::ops {

namespace {

void check_same(const Tensor& a, const Tensor& b, const char* what) {
  b.expect_shape(a.shape(), what);
  b.expect_dtype(DType::f32, what);
}

}  // namespace

void bias_add(Tensor& y, const Tensor& bias) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("bias_add", {&y, &bias});
  MOE_CHECK(y.ndim() == 2, "bias_add: ", y.describe(), " is not 2-D [N,C]");
  y.expect_dtype(DType::f32, "bias_add output");
  const int64_t c = y.dim(1);
  bias.expect_shape({c}, "bias_add bias");
  bias.expect_dtype(DType::f32, "bias_add bias");
  backend_for(device).dense.bias_add(y, bias);
}

void bias_grad(const Tensor& dy, Tensor& dbias) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("bias_grad", {&dy, &dbias});
  MOE_CHECK(dy.ndim() == 2, "bias_grad: ", dy.describe(), " is not 2-D [N,C]");
  dy.expect_dtype(DType::f32, "bias_grad dy");
  const int64_t c = dy.dim(1);
  dbias.expect_shape({c}, "bias_grad gradient");
  dbias.expect_dtype(DType::f32, "bias_grad gradient");
  backend_for(device).dense.bias_grad(dy, dbias);
}

void gelu_forward(const Tensor& x, Tensor& y) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("gelu_forward", {&x, &y});
  x.expect_dtype(DType::f32, "gelu_forward input");
  check_same(x, y, "gelu_forward output");
  backend_for(device).dense.gelu_forward(x, y);
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("gelu_backward", {&dy, &x, &dx});
  x.expect_dtype(DType::f32, "gelu_backward input");
  check_same(x, dy, "gelu_backward dy");
  check_same(x, dx, "gelu_backward dx");
  backend_for(device).dense.gelu_backward(dy, x, dx);
}

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("swiglu_forward", {&gate, &up, &y});
  gate.expect_dtype(DType::f32, "swiglu_forward gate");
  check_same(gate, up, "swiglu_forward up");
  check_same(gate, y, "swiglu_forward output");
  backend_for(device).dense.swiglu_forward(gate, up, y);
}

void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("swiglu_backward", {&dy, &gate, &up, &dgate, &dup});
  gate.expect_dtype(DType::f32, "swiglu_backward gate");
  check_same(gate, up, "swiglu_backward up");
  check_same(gate, dy, "swiglu_backward dy");
  check_same(gate, dgate, "swiglu_backward dgate");
  check_same(gate, dup, "swiglu_backward dup");
  backend_for(device).dense.swiglu_backward(dy, gate, up, dgate, dup);
}

}  // namespace moe::ops
