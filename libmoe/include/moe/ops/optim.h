// Optimizer ops: the AdamW update, elementwise on fp32 master weights and moments.
#pragma once
#include "moe/tensor.h"

namespace moe::kernels {
struct AdamWScalars;  // kernels/adamw.h: lr, betas, eps, weight decay, bias corrections
}  // namespace moe::kernels

namespace moe::ops {

// kernels::adamw_update on every element of master, m, v (f32, same shape) with grad, in place;
// all four on one device.
void adamw_update(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                  const kernels::AdamWScalars& scalars);

}  // namespace moe::ops
