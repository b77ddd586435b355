// CUDA implementations of the core ops (moe/ops/core.h) and of the tensor conversions, put in the
// op table by backend/cuda/backend.cpp. Called through the table after the op's operand checks,
// with every tensor on one CUDA device.
#pragma once
#include "moe/tensor.h"

namespace moe::cuda {

// dst = src converted (f32, bf16, f16 in any pair; same shape, same device).
void convert(const Tensor& src, Tensor& dst);
void fill(Tensor& t, float value);  // f32, bf16, f16, i32

// Row-major C = alpha op(A) op(B) + beta C through cublasSgemm (IEEE fp32, no tensor-op math).
void gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
          float alpha, float beta);
void axpy(float alpha, const Tensor& x, Tensor& y);
void round_to_dtype(Tensor& x, DType dtype);
// fp64 partial sums over a fixed grid (independent of n), added on the host in thread order.
double sum_squares(const Tensor& x);

}  // namespace moe::cuda
