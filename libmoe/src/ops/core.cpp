// Core ops: operand checks and the device's table (Backend::core); require_backend, which every
// op calls first.
#include "moe/ops/core.h"

#include "backend/cpu/gemv.h"
#include "core/backend.h"
#include "moe/step_breakdown.h"

namespace moe::ops {

Device require_backend(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t || !t->defined()) continue;
    if (!backend_available(t->device().kind))
      throw Error(str(op, ": ", t->describe(), " is on a device this build has no backend for"));
    if (!first) {
      first = t;
    } else if (!(t->device() == first->device())) {
      throw Error(
          str(op, ": operands on different devices: ", first->describe(), " and ", t->describe()));
    }
  }
  return first ? first->device() : Device{};
}

void gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
          float alpha, float beta) {
  const PartScope part(StepPart::gemm);
  const Device device = require_backend("gemm", {&a, &b, &c});
  MOE_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2, "gemm: 2-D operands expected, got ",
            a.describe(), ", ", b.describe(), ", ", c.describe());
  a.expect_dtype(DType::f32, "gemm A");
  // A bf16/f16 B is a weight kept in 16 bits for inference, a q8_0 B one kept as Q8_0 row groups
  // [N, q8_group_row_bytes(K)], a q4_k / q6_k / mxfp4 B one kept as block rows [N, row bytes]
  // (backend/cpu/gemv.h); the CPU widens them on the fly.
  MOE_CHECK(b.dtype() != DType::u8, "gemm: B ", b.describe(),
            " holds quantised rows as a file does; the kernels read Q8_0 row groups (DType::q8_0: "
            "cpu::pack_q8_0) or block rows (DType::q4_k, q6_k, mxfp4: cpu::block_rows), as "
            "infer::load_model makes them");
  const bool low_bit =
      b.dtype() == DType::bf16 || b.dtype() == DType::f16 || is_quantized(b.dtype());
  MOE_CHECK(b.dtype() == DType::f32 || (low_bit && !transpose_a && transpose_b && alpha == 1.0f &&
                                        device.kind == Device::cpu),
            "gemm: B ", b.describe(),
            " must be f32 (a bf16/f16/quantised weight only as x W^T on the CPU, for inference)");
  c.expect_dtype(DType::f32, "gemm C");
  int64_t m = transpose_a ? a.dim(1) : a.dim(0);
  int64_t k = transpose_a ? a.dim(0) : a.dim(1);
  int64_t kb = transpose_b ? b.dim(1) : b.dim(0);
  if (transpose_b) kb = cpu::weight_row_elements(b, k);  // a quantised B's row counts bytes
  int64_t n = transpose_b ? b.dim(0) : b.dim(1);
  MOE_CHECK(k == kb && c.dim(0) == m && c.dim(1) == n, "gemm: shapes do not chain: ", a.describe(),
            transpose_a ? "^T" : "", " x ", b.describe(), transpose_b ? "^T" : "", " -> ",
            c.describe());
  count_gemm_flops(m, n, k);
  backend_for(device).core.gemm(a, transpose_a, b, transpose_b, c, alpha, beta);
}

void axpy(float alpha, const Tensor& x, Tensor& y) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("axpy", {&x, &y});
  MOE_CHECK(x.shape() == y.shape(), "axpy: ", x.describe(), " vs ", y.describe());
  x.expect_dtype(DType::f32, "axpy x");
  y.expect_dtype(DType::f32, "axpy y");
  backend_for(device).core.axpy(alpha, x, y);
}

void scale(Tensor& x, float alpha) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("scale", {&x});
  x.expect_dtype(DType::f32, "scale");
  backend_for(device).core.scale(x, alpha);
}

void round_to_dtype(Tensor& x, DType dtype) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("round_to_dtype", {&x});
  if (dtype == DType::f32) return;
  x.expect_dtype(DType::f32, "round_to_dtype");
  backend_for(device).core.round_to_dtype(x, dtype);
}

double sum_squares(const Tensor& x) {
  const PartScope part(StepPart::optimizer);
  const Device device = require_backend("sum_squares", {&x});
  x.expect_dtype(DType::f32, "sum_squares");
  return backend_for(device).core.sum_squares(x);
}

}  // namespace moe::ops
