// Kernel bodies of the experts around the grouped GEMM: bias + activation rows (gelu, swiglu and
// clamped swiglu flavours), their backward, and row sums for the bias gradient.
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

// swiglu_clamped flavour (gpt-oss): h1 += bias (may be null), kept unclamped for backward;
// g = min(h1, limit), u = clamp(h3, -limit, limit), a = (u + 1) * g * sigmoid(alpha g). The
// clamps are selects (`v > limit ? limit : v`), so a NaN passes through as in torch.
MOE_HD float clamp_gate(float v, float limit) { return v > limit ? limit : v; }
MOE_HD float clamp_up(float v, float limit) {
  return v > limit ? limit : (v < -limit ? -limit : v);
}
MOE_HD void bias_clamped_swiglu_row(float* h1, const float* h3, const float* bias, float alpha,
                                    float limit, float* a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = bias ? h1[i] + bias[i] : h1[i];
    h1[i] = v;
    const float g = clamp_gate(v, limit);
    a[i] = (clamp_up(h3[i], limit) + 1.0f) * (g * sigmoid(alpha * g));
  }
}
// d/dg [g sigmoid(alpha g)] = s (1 + alpha g (1 - s)), s = sigmoid(alpha g). The gradient is zero
// where a clamp bites (h1 > limit; |h3| > limit) and passes at exactly the limit (torch's
// clamp / min backward: `x <= max`, `x >= min`).
MOE_HD void clamped_swiglu_backward_row(const float* h1, const float* h3, const float* da,
                                        float alpha, float limit, float* dh1, float* dh3,
                                        int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = da[i], v = h1[i], w = h3[i];
    const float g = clamp_gate(v, limit);
    const float s = sigmoid(alpha * g);
    const float glu_grad = s * (1.0f + alpha * g * (1.0f - s));
    dh1[i] = v > limit ? 0.0f : d * (clamp_up(w, limit) + 1.0f) * glu_grad;
    dh3[i] = (w > limit || w < -limit) ? 0.0f : d * (g * s);
  }
}

MOE_HD void add_row(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace moe::kernels
