// Core ops: GEMM and elementwise helpers on fp32 tensors. Each op checks its operands (shape,
// dtype, device) and dispatches on the device of its tensors.
#pragma once
#include "moe/tensor.h"

namespace moe::ops {

// C = alpha * op(A) op(B) + beta * C, row-major 2-D fp32; op(X) = X^T when the flag is set.
void gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
          float alpha = 1.0f, float beta = 0.0f);

// y += alpha * x (same shape, fp32)
void axpy(float alpha, const Tensor& x, Tensor& y);

// x *= alpha, in place (fp32).
void scale(Tensor& x, float alpha);

// Round fp32 values in place to what `dtype` can store (activation storage precision).
void round_to_dtype(Tensor& x, DType dtype);

// Sum of squares of all elements (fp64 accumulation, fixed order).
double sum_squares(const Tensor& x);

// Throws moe::Error when any tensor is on a device this build (or machine) has no backend for, or
// when the defined tensors are not all on one device; returns that device.
Device require_backend(const char* op, std::initializer_list<const Tensor*> tensors);

}  // namespace moe::ops
