// Optimizer ops: the AdamW update, elementwise on fp32 master weights and moments.
#pragma once
#include "moe/tensor.h"

namespace moe::kernels {
struct AdamWScalars;  // kernels/adamw.h: lr, betas, eps, weight decay, bias corrections
}  // namespace moe::kernels

namespace moe::ops {

// kernels::adamw_update on every element of master, m, v (f32, same element count) with grad
// (f32), in place; all four on one device. Views (Tensor::rows) update just their elements.
void adamw_update(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                  const kernels::AdamWScalars& scalars);

// adamw_update, then value (bf16/f16, same element count) = master rounded to value's dtype as
// Tensor::copy_from rounds, and, when compute is not null, compute (f32) = value upcast, as
// Param::refresh_compute makes it. The CPU backend does all three in one pass over memory; a
// backend without the fused entry runs them one after the other (same bits).
void adamw_update_rounded(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                          const kernels::AdamWScalars& scalars, Tensor& value, Tensor* compute);

}  // namespace moe::ops
