// AdamW update of one element (decoupled weight decay, Loshchilov & Hutter), fp32 master and
// moments.
#pragma once
#include "kernels/common.h"

namespace moe::kernels {

struct AdamWScalars {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1, bias_correction2;  // 1 - beta^t
};

MOE_HD void adamw_update(float& master, float& m, float& v, float grad, const AdamWScalars& s) {
  m = s.beta1 * m + (1.0f - s.beta1) * grad;
  v = s.beta2 * v + (1.0f - s.beta2) * grad * grad;
  float m_hat = m / s.bias_correction1;
  float v_hat = v / s.bias_correction2;
  master -= s.lr * (m_hat / (sqrtf(v_hat) + s.eps) + s.weight_decay * master);
}

}  // namespace moe::kernels
