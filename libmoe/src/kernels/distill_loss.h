// Knowledge-distillation loss of one row of V student logits against a teacher's logits and a
// target class, fp32 with max-subtraction (Hinton et al.; DeepSpeed-MoE Mixture-of-Students).
//
//   ce  = logsumexp(s) - s[target]
//   kd  = T^2 * KL(softmax(t/T) || softmax(s/T))
//       = T^2 * sum_j q_j (log q_j - log p_j),   q = softmax(t/T), p = softmax(s/T)
//   d ce / d s_j = softmax(s)_j - [j == target]
//   d kd / d s_j = T * (p_j - q_j)
#pragma once
#include "kernels/common.h"

namespace moe::kernels {

struct DistillRow {
  float ce, kd;
};

// Returns the row's ce and kd. When dx is not null it is written with
// grad_scale * (ce_weight * d ce/d s + kd_weight * d kd/d s). 0 <= target < n and T > 0 are the
// caller's to check. No scratch memory: three passes over the row.
MOE_HD DistillRow distill_loss_row(const float* s, const float* t, int64_t n, int32_t target,
                                   float temperature, float ce_weight, float kd_weight, float* dx,
                                   float grad_scale) {
  const float inv_t = 1.0f / temperature;
  float ms = s[0], mt = t[0];
  for (int64_t j = 1; j < n; ++j) {
    ms = s[j] > ms ? s[j] : ms;
    mt = t[j] > mt ? t[j] : mt;
  }
  // Sums of exp(s - ms), exp((s - ms)/T), exp((t - mt)/T), and the KL sum, accumulated in double
  // so that their error does not grow with V (see kernels/cross_entropy.h).
  double sum_s = 0.0, sum_st = 0.0, sum_tt = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    sum_s += expf(s[j] - ms);
    sum_st += expf((s[j] - ms) * inv_t);
    sum_tt += expf((t[j] - mt) * inv_t);
  }
  const float log_sum_st = static_cast<float>(log(sum_st));
  const float log_sum_tt = static_cast<float>(log(sum_tt));
  double kl = 0.0;
  const float ce_scale = static_cast<float>(grad_scale * ce_weight / sum_s);
  const float kd_scale = grad_scale * kd_weight * temperature;
  for (int64_t j = 0; j < n; ++j) {
    const float log_p = (s[j] - ms) * inv_t - log_sum_st;
    const float log_q = (t[j] - mt) * inv_t - log_sum_tt;
    const float q = expf(log_q);
    kl += q * (log_q - log_p);
    if (dx) dx[j] = ce_scale * expf(s[j] - ms) + kd_scale * (expf(log_p) - q);
  }
  if (dx) dx[target] -= grad_scale * ce_weight;
  DistillRow row;
  row.ce = static_cast<float>(static_cast<double>(ms - s[target]) + log(sum_s));
  // KL >= 0; rounding can leave a tiny negative value when the distributions agree.
  row.kd = temperature * temperature * static_cast<float>(kl > 0.0 ? kl : 0.0);
  return row;
}

}  // namespace moe::kernels
