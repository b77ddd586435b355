// Activation functions and their derivatives (per element).
#pragma once
#include "kernels/common.h"

namespace moe::kernels {

// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
MOE_HD float gelu_tanh(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2/pi)
  float u = c * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
MOE_HD float gelu_tanh_grad(float x) {
  const float c = 0.7978845608028654f;
  float x2 = x * x;
  float u = c * (x + 0.044715f * x2 * x);
  float t = tanhf(u);
  float du = c * (1.0f + 3.0f * 0.044715f * x2);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

// SiLU (swish): x * sigmoid(x)
MOE_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
MOE_HD float silu(float x) { return x * sigmoid(x); }
MOE_HD float silu_grad(float x) {
  float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

}  // namespace moe::kernels
