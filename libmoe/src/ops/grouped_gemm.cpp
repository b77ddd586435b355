// Grouped expert GEMM, the experts' bias and activation: operand checks (the expert segments
// given by offsets [E+1] must tile the rows), then Backend::moe.
// Shapes: M rows of the permuted buffer, D model width, F expert hidden width, E experts.
#include <vector>

#include "backend/cpu/gemv.h"
#include "core/backend.h"
#include "moe/ops/core.h"
#include "moe/ops/moe.h"
#include "moe/step_breakdown.h"

namespace moe::ops {
namespace {

// Segments must tile [0, rows) in order.
void check_offsets(const char* op, const std::vector<int32_t>& offsets, int64_t experts,
                   int64_t rows, const Tensor& t) {
  MOE_CHECK(static_cast<int64_t>(offsets.size()) == experts + 1, op, ": ", offsets.size(),
            " expert offsets for ", experts, " experts (", t.describe(), ")");
  MOE_CHECK(offsets.front() == 0 && offsets.back() == rows, op, ": expert offsets span [",
            offsets.front(), ", ", offsets.back(), ") but ", t.describe(), " has ", rows, " rows");
  for (int64_t e = 0; e < experts; ++e)
    MOE_CHECK(offsets[e] <= offsets[e + 1], op, ": expert offsets decrease at expert ", e);
}

// The clamped SwiGLU's limit bounds a clamp from both sides: it must be a positive finite number
// (a NaN limit would clamp nothing and make the gradient's masks disagree with the forward).
void check_clamp(const char* op, SwigluClamp clamp) {
  MOE_CHECK(clamp.limit > 0.0f && clamp.limit <= 3.0e38f && clamp.alpha == clamp.alpha &&
                clamp.alpha > -3.0e38f && clamp.alpha < 3.0e38f,
            op, ": the clamped SwiGLU needs a positive finite limit and a finite alpha (got limit ",
            clamp.limit, ", alpha ", clamp.alpha, ")");
}

}  // namespace

void grouped_gemm(const Tensor& a, const Tensor& w, bool transpose_w,
                  const std::vector<int32_t>& offsets, Tensor& c, float beta) {
  const PartScope part(StepPart::gemm);
  const Device device = require_backend("grouped_gemm", {&a, &w, &c});
  a.expect_dtype(DType::f32, "grouped_gemm A");
  MOE_CHECK(w.dtype() != DType::u8, "grouped_gemm: W ", w.describe(),
            " holds quantised rows as a file does; the kernels read Q8_0 row groups (DType::q8_0: "
            "cpu::pack_q8_0) or block rows (DType::q4_k, q6_k, mxfp4: cpu::block_rows), as "
            "infer::load_model makes them");
  const bool low_bit =
      w.dtype() == DType::bf16 || w.dtype() == DType::f16 || is_quantized(w.dtype());
  MOE_CHECK(w.dtype() == DType::f32 || (low_bit && transpose_w && device.kind == Device::cpu),
            "grouped_gemm: W ", w.describe(),
            " must be f32 (a bf16/f16/quantised weight only as x W^T on the CPU, for inference)");
  c.expect_dtype(DType::f32, "grouped_gemm C");
  MOE_CHECK(a.ndim() == 2 && w.ndim() == 3 && c.ndim() == 2,
            "grouped_gemm: A [M,K], W [E,R,S], C [M,N] expected, got ", a.describe(), ", ",
            w.describe(), ", ", c.describe());
  const int64_t experts = w.dim(0), r = w.dim(1), s = w.dim(2), rows = a.dim(0);
  int64_t k = transpose_w ? s : r;
  const int64_t n = transpose_w ? r : s;
  if (transpose_w) k = cpu::weight_row_elements(w, a.dim(1));  // a quantised W's row counts bytes
  MOE_CHECK(a.dim(1) == k && c.dim(0) == rows && c.dim(1) == n,
            "grouped_gemm: shapes do not chain: ", a.describe(), " x ", w.describe(),
            transpose_w ? "^T" : "", " -> ", c.describe());
  check_offsets("grouped_gemm", offsets, experts, rows, a);
  count_gemm_flops(rows, n, k);
  backend_for(device).moe.grouped_gemm(a, w, transpose_w, offsets, c, beta);
}

void grouped_gemm_weight_grad(const Tensor& dy, const Tensor& x,
                              const std::vector<int32_t>& offsets, Tensor& dw) {
  const PartScope part(StepPart::gemm);
  const Device device = require_backend("grouped_gemm_weight_grad", {&dy, &x, &dw});
  dy.expect_dtype(DType::f32, "grouped_gemm_weight_grad dY");
  x.expect_dtype(DType::f32, "grouped_gemm_weight_grad X");
  dw.expect_dtype(DType::f32, "grouped_gemm_weight_grad dW");
  MOE_CHECK(dy.ndim() == 2 && x.ndim() == 2 && dw.ndim() == 3,
            "grouped_gemm_weight_grad: dY [M,R], X [M,S], dW [E,R,S] expected, got ", dy.describe(),
            ", ", x.describe(), ", ", dw.describe());
  const int64_t experts = dw.dim(0), r = dw.dim(1), s = dw.dim(2), rows = dy.dim(0);
  MOE_CHECK(dy.dim(1) == r && x.dim(0) == rows && x.dim(1) == s,
            "grouped_gemm_weight_grad: shapes do not chain: ", dy.describe(), "^T x ", x.describe(),
            " -> ", dw.describe());
  check_offsets("grouped_gemm_weight_grad", offsets, experts, rows, dy);
  count_gemm_flops(r, s, rows);
  backend_for(device).moe.grouped_gemm_weight_grad(dy, x, offsets, dw);
}

void expert_activation(Tensor& h, const Tensor& h3, const Tensor& bias,
                       const std::vector<int32_t>& offsets, Activation activation, Tensor& a,
                       SwigluClamp clamp) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("expert_activation", {&h, &h3, &bias, &a});
  h.expect_dtype(DType::f32, "expert_activation h");
  MOE_CHECK(h.ndim() == 2, "expert_activation: [M,F] expected, got ", h.describe());
  const int64_t rows = h.dim(0), width = h.dim(1);
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1;
  check_offsets("expert_activation", offsets, experts, rows, h);
  a.expect_shape(h.shape(), "expert_activation a");
  if (bias.defined()) bias.expect_shape({experts, width}, "expert_activation bias");
  if (gated(activation)) h3.expect_shape(h.shape(), "expert_activation h3");
  if (activation == Activation::swiglu_clamped) check_clamp("expert_activation", clamp);
  backend_for(device).moe.expert_activation(h, h3, bias, offsets, activation, clamp, a);
}

void expert_activation_backward(const Tensor& da, const Tensor& h, const Tensor& h3,
                                Activation activation, Tensor& dh, Tensor& dh3, SwigluClamp clamp) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("expert_activation_backward", {&da, &h, &h3, &dh, &dh3});
  da.expect_dtype(DType::f32, "expert_activation_backward da");
  MOE_CHECK(da.ndim() == 2, "expert_activation_backward: [M,F] expected, got ", da.describe());
  h.expect_shape(da.shape(), "expert_activation_backward h");
  dh.expect_shape(da.shape(), "expert_activation_backward dh");
  if (gated(activation)) {
    h3.expect_shape(da.shape(), "expert_activation_backward h3");
    dh3.expect_shape(da.shape(), "expert_activation_backward dh3");
  }
  if (activation == Activation::swiglu_clamped) check_clamp("expert_activation_backward", clamp);
  backend_for(device).moe.expert_activation_backward(da, h, h3, activation, clamp, dh, dh3);
}

void grouped_add_bias(Tensor& y, const Tensor& bias, const std::vector<int32_t>& offsets) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("grouped_add_bias", {&y, &bias});
  y.expect_dtype(DType::f32, "grouped_add_bias y");
  MOE_CHECK(y.ndim() == 2, "grouped_add_bias: [M,D] expected, got ", y.describe());
  const int64_t rows = y.dim(0), width = y.dim(1);
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1;
  check_offsets("grouped_add_bias", offsets, experts, rows, y);
  bias.expect_shape({experts, width}, "grouped_add_bias bias");
  backend_for(device).moe.grouped_add_bias(y, bias, offsets);
}

void grouped_bias_grad(const Tensor& dy, const std::vector<int32_t>& offsets, Tensor& dbias) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("grouped_bias_grad", {&dy, &dbias});
  dy.expect_dtype(DType::f32, "grouped_bias_grad dy");
  MOE_CHECK(dy.ndim() == 2, "grouped_bias_grad: [M,D] expected, got ", dy.describe());
  const int64_t rows = dy.dim(0), width = dy.dim(1);
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1;
  check_offsets("grouped_bias_grad", offsets, experts, rows, dy);
  dbias.expect_shape({experts, width}, "grouped_bias_grad dbias");
  dbias.expect_dtype(DType::f32, "grouped_bias_grad dbias");
  backend_for(device).moe.grouped_bias_grad(dy, offsets, dbias);
}

}  // namespace moe::ops
