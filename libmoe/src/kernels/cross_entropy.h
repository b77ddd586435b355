// Cross-entropy of one row of V logits against a target class, fp32 logits with max-subtraction.
// The sum of exp(x - max) is accumulated in double: an fp32 running sum rounds every addition
// relative to the growing total, an error that grows with V (at V = 70,000 it biased every
// log-prob by ~8e-5 nats/token); in double the sum's error stays below fp32's own rounding of the
// terms whatever V. One row is one thread on CUDA, so this costs V double adds per row there too.
#pragma once
#include "kernels/common.h"

namespace moe::kernels {

// Returns nll = logsumexp(x) - x[target]. When dx is not null it is written with
// grad_scale * (softmax(x) - onehot(target)). 0 <= target < n is the caller's to check.
MOE_HD float cross_entropy_row(const float* x, int64_t n, int32_t target, float* dx,
                               float grad_scale) {
  float m = x[0];
  for (int64_t j = 1; j < n; ++j) m = x[j] > m ? x[j] : m;
  double s = 0.0;
  if (dx) {  // keep exp(x - m) in dx: one exp per element
    for (int64_t j = 0; j < n; ++j) {
      dx[j] = expf(x[j] - m);
      s += dx[j];
    }
    const float factor = static_cast<float>(grad_scale / s);
    for (int64_t j = 0; j < n; ++j) dx[j] *= factor;
    dx[target] -= grad_scale;
  } else {
    for (int64_t j = 0; j < n; ++j) s += expf(x[j] - m);
  }
  // logsumexp - x[target] = (m - x[target]) + log(s): the difference of two floats is exact when
  // they are close (Sterbenz), and log(s) is taken in double before the one final rounding.
  return static_cast<float>(static_cast<double>(m - x[target]) + log(s));
}

// One row of the cross-entropy op: a negative target is ignored (nll 0, dx zeroed when not null),
// else cross_entropy_row.
MOE_HD float cross_entropy_target_row(const float* x, int64_t n, int32_t target, float* dx,
                                      float grad_scale) {
  if (target < 0) {
    if (dx)
      for (int64_t j = 0; j < n; ++j) dx[j] = 0.0f;
    return 0.0f;
  }
  return cross_entropy_row(x, n, target, dx, grad_scale);
}

}  // namespace moe::kernels
