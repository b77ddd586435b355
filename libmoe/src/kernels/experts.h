// Kernel bodies of the experts around the grouped GEMM: bias + activation rows (gelu and swiglu
// flavours), their backward, and row sums for the bias gradient.
// Shapes: M rows of the permuted buffer, D model width, F expert hidden width.
#pragma once
#include "kernels/activations.h"
#include "kernels/common.h"

namespace moe::kernels {

// gelu flavour: h += bias (bias may be null); a = gelu(h). h keeps the pre-activation for backward.
MOE_HD void bias_gelu_row(float* h, const float* bias, float* a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = bias ? h[i] + bias[i] : h[i];
    h[i] = v;
    a[i] = gelu_tanh(v);
  }
}
MOE_HD void gelu_backward_row(const float* h, const float* da, float* dh, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dh[i] = da[i] * gelu_tanh_grad(h[i]);
}

// swiglu flavour: h1 += bias (may be null); a = silu(h1) * h3.
MOE_HD void bias_swiglu_row(float* h1, const float* h3, const float* bias, float* a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = bias ? h1[i] + bias[i] : h1[i];
    h1[i] = v;
    a[i] = silu(v) * h3[i];
  }
}
MOE_HD void swiglu_backward_row(const float* h1, const float* h3, const float* da, float* dh1,
                                float* dh3, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float g = da[i];
    dh1[i] = g * h3[i] * silu_grad(h1[i]);
    dh3[i] = g * silu(h1[i]);
  }
}

MOE_HD void add_row(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace moe::kernels
