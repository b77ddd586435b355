// Optimizer ops: the device choice for the AdamW update (Backend::optim).
#include "moe/ops/optim.h"

#include "core/backend.h"
#include "moe/ops/core.h"

namespace moe::ops {

void adamw_update(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                  const kernels::AdamWScalars& scalars) {
  const Device device = require_backend("adamw", {&master, &m, &v, &grad});
  backend_for(device).optim.adamw_update(master, m, v, grad, scalars);
}

}  // namespace moe::ops
