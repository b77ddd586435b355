// Activation functions and their derivatives (per element).
#pragma once
#include <cstring>

#include "kernels/common.h"

namespace moe::kernels {

// exp and tanh of a float in IEEE single-precision adds, multiplies (and for tanh one divide) in a
// fixed order, and exact bit operations: no libm call, no fused multiply-add (the files that use
// them build with -ffp-contract=off, and nvcc with --fmad=false), so they round the same on every
// CPU at every vector width and on the GPU, whatever the libm. Checked over all floats against
// double: exp_f within 0.99 ulp (glibc 2.36's expf: 0.50), tanh_f within 1.46 ulp (its tanhf:
// 2.19); test_activation_rows.cpp keeps a sample. Coefficients: least-squares fits reweighted
// towards the minimax error (relative 3.1e-9 and 1.1e-9 in double), rounded to float.
//
// The shared core: e^y = 2^k e^r for |y| <= 104, k = round(y / ln 2) by the 1.5 * 2^23 shift,
// r = y - k ln 2 (ln 2 in two parts, k ln2_hi exact), e^r = 1 + r + r^2 Q(r) on |r| <= ln 2 / 2.
// Returns e^r and sets k.
MOE_HD float exp_reduced(float y, int32_t& k) {
  const float kf = (y * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (y - kf * 0.693145751953125f) - kf * 1.428606765330187e-06f;
  const float q =
      0.4999999403953552f +
      r * (0.1666651964187622f +
           r * (0.04166839271783829f + r * (0.00836878176778555f + r * 0.0013814459089189768f)));
  k = static_cast<int32_t>(kf);
  return 1.0f + (r + r * r * q);
}

// 2^k for k in [-126, 127], exactly.
MOE_HD float exp2_exact(int32_t k) {
  const uint32_t bits = static_cast<uint32_t>(k + 127) << 23;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

// exp_f: x clamped to [-104, 89] (0 and inf beyond; a NaN x is clamped to -104 too, so that no
// NaN reaches the float-to-int conversion); 2^k applied as two exact powers of two, so that
// results below 2^-126 round once (gradual underflow). NaN passes.
MOE_HD float exp_f(float x) {
  int32_t k;
  const float er = exp_reduced(x > -104.0f ? (x < 89.0f ? x : 89.0f) : -104.0f, k);
  const int32_t k1 = k / 2;  // k in [-150, 128]: both halves in range
  const float e = (er * exp2_exact(k1)) * exp2_exact(k - k1);
  return x == x ? e : x;
}

// tanh_f: |x| < 0.55: x + x^3 P(x^2); otherwise 1 - 2 / (e^{2|x|} + 1), 2|x| clamped to 19 (tanh
// rounds to 1 from 9.01 on; k <= 28, one power of two; a NaN is clamped too). Both branches are
// computed and one selected (the loops vectorise without masks); NaN passes.
MOE_HD float tanh_f(float x) {
  const float a = fabsf(x);
  const float z = a * a;
  const float p =
      -0.33333319425582886f +
      z * (0.13332600891590118f +
           z * (-0.053853850811719894f + z * (0.021077735349535942f + z * -0.006282441783696413f)));
  const float small = a + a * z * p;
  int32_t k;
  const float er = exp_reduced((a < 9.5f ? a : 9.5f) * 2.0f, k);
  const float large = 1.0f - 2.0f / (er * exp2_exact(k) + 1.0f);
  const float t = copysignf(a < 0.55f ? small : large, x);
  return x == x ? t : x;
}

// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
MOE_HD float gelu_tanh(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2/pi)
  float u = c * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanh_f(u));
}
MOE_HD float gelu_tanh_grad(float x) {
  const float c = 0.7978845608028654f;
  float x2 = x * x;
  float u = c * (x + 0.044715f * x2 * x);
  float t = tanh_f(u);
  float du = c * (1.0f + 3.0f * 0.044715f * x2);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

// SiLU (swish): x * sigmoid(x)
MOE_HD float sigmoid(float x) { return 1.0f / (1.0f + exp_f(-x)); }
MOE_HD float silu(float x) { return x * sigmoid(x); }
MOE_HD float silu_grad(float x) {
  float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

}  // namespace moe::kernels
