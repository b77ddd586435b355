// Optimizer ops: operand checks and the device choice for the AdamW update (Backend::optim).
#include "moe/ops/optim.h"

#include "core/backend.h"
#include "moe/ops/core.h"
#include "moe/step_breakdown.h"

namespace moe::ops {
namespace {

void check_adamw(const char* op, const Tensor& master, const Tensor& m, const Tensor& v,
                 const Tensor& grad) {
  const int64_t n = master.numel();
  for (const Tensor* t : {&master, &m, &v, &grad}) {
    t->expect_dtype(DType::f32, op);
    MOE_CHECK(t->numel() == n, op, ": ", t->describe(), " has ", t->numel(),
              " elements, the master ", master.describe(), " has ", n);
  }
}

}  // namespace

void adamw_update(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                  const kernels::AdamWScalars& scalars) {
  const PartScope part(StepPart::optimizer);
  const Device device = require_backend("adamw", {&master, &m, &v, &grad});
  check_adamw("adamw", master, m, v, grad);
  backend_for(device).optim.adamw_update(master, m, v, grad, scalars);
}

void adamw_update_rounded(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                          const kernels::AdamWScalars& scalars, Tensor& value, Tensor* compute) {
  const PartScope part(StepPart::optimizer);
  const Device device = require_backend("adamw", {&master, &m, &v, &grad, &value, compute});
  check_adamw("adamw", master, m, v, grad);
  MOE_CHECK(value.dtype() == DType::bf16 || value.dtype() == DType::f16,
            "adamw: the rounded storage ", value.describe(), " must be bf16 or f16");
  MOE_CHECK(value.numel() == master.numel(), "adamw: storage ", value.describe(),
            " does not match the master ", master.describe());
  if (compute) {
    compute->expect_dtype(DType::f32, "adamw compute copy");
    MOE_CHECK(compute->numel() == master.numel(), "adamw: compute copy ", compute->describe(),
              " does not match the master ", master.describe());
  }
  const Backend& backend = backend_for(device);
  if (backend.optim.adamw_update_rounded) {
    backend.optim.adamw_update_rounded(master, m, v, grad, scalars, value, compute);
    return;
  }
  backend.optim.adamw_update(master, m, v, grad, scalars);
  // copy_from wants equal shapes; the element counts already match.
  value.copy_from(master.reshape(value.shape()));
  if (compute) compute->copy_from(value.reshape(compute->shape()));
}

}  // namespace moe::ops
