// Kernel bodies of the router, one token row at a time: Switch jitter, sigmoid scores
// (DeepSeek-V3), top-k selection (optionally on scores plus a per-expert selection bias) and
// renormalisation, and the gate/softmax/aux/z backward of a row (and its sigmoid counterpart).
// Shapes: N tokens, D model width, E experts, k experts per token.
#pragma once
#include "kernels/activations.h"
#include "kernels/common.h"
#include "kernels/philox.h"
#include "kernels/softmax.h"

namespace moe::kernels {

// Router centring (nn::RouterConfig::center), W' = W - C (W c) c^T / |c|^2 with C the centring
// over experts: |c|^2 and expert e's projection (w_e . c) / |c|^2, in double, elements in order.
// Then k_e = (float)(p_e - mean over experts of p, summed in order) and W'[e, i] = W[e, i] - k_e
// c[i]; W' = W exactly when c = 0.
MOE_HD double center_norm2(const float* c, int64_t d) {
  double cc = 0;
  for (int64_t i = 0; i < d; ++i) cc += static_cast<double>(c[i]) * c[i];
  return cc;
}
MOE_HD double center_projection(const float* w_row, const float* c, int64_t d, double cc) {
  double a = 0;
  for (int64_t i = 0; i < d; ++i) a += static_cast<double>(w_row[i]) * c[i];
  return a / cc;
}
// The mean of the experts' projections p, summed in expert order, and expert e's shift
// k_e = (float)(p_e - mean).
MOE_HD double center_mean(const double* p, int64_t experts) {
  double mean = 0;
  for (int64_t e = 0; e < experts; ++e) mean += p[e];
  return mean / static_cast<double>(experts);
}
MOE_HD float center_shift(double p_e, double mean) { return static_cast<float>(p_e - mean); }
// One element of W': W[e, i] - k_e c[i].
MOE_HD float centred_element(float w, float k_e, float c_i) { return w - k_e * c_i; }

// Switch jitter: a factor uniform in (1 - jitter, 1 + jitter), a pure function of (key, index).
MOE_HD float jitter_factor(uint64_t key, uint64_t index, float jitter) {
  float u = uniform_from_bits(philox4x32(key, index).v[0]);
  return (1.0f - jitter) + 2.0f * jitter * u;
}

// Sigmoid scoring of one row: scores[e] = sigmoid(logits[e]), probs[e] = scores[e] / sum of the
// row's scores (what the aux loss's P_e averages); returns logsumexp(logits) (the z-loss reads it
// as under softmax scoring).
MOE_HD float sigmoid_row(const float* logits, float* scores, float* probs, int64_t n) {
  float m = logits[0];
  for (int64_t j = 1; j < n; ++j) m = logits[j] > m ? logits[j] : m;
  float z = 0.0f, sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    z += expf(logits[j] - m);
    scores[j] = sigmoid(logits[j]);
    sum += scores[j];
  }
  const float inv = 1.0f / sum;  // sum > 0: every score is
  for (int64_t j = 0; j < n; ++j) probs[j] = scores[j] * inv;
  return m + logf(z);
}

// Experts in groups of a router's choice: at most this many (DeepSeek-V3 and GLM-4.5 use 8 or 1).
inline constexpr int64_t kMaxRouterGroups = 64;

// Group-limited choice (DeepSeek-V3's noaux_tc, GLM-4-MoE), groups > 1: experts 0..E) form
// `groups` groups of E/groups in order; a group scores the sum of its two largest keys (key =
// p + bias), the `group_topk` best groups stay (ties: the lower group), and every other expert's
// key becomes 0 (transformers masks them with 0.0, not -inf: we choose as it does). Writes
// chosen[g] = whether group g stayed. groups <= kMaxRouterGroups, E/groups >= 2.
MOE_HD void topk_groups_row(const float* p, const float* bias, int64_t num_experts, int64_t groups,
                            int64_t group_topk, bool* chosen) {
  const int64_t size = num_experts / groups;
  float group_score[kMaxRouterGroups];
  for (int64_t g = 0; g < groups; ++g) {
    float first = 0.0f, second = 0.0f;
    for (int64_t i = 0; i < size; ++i) {
      const int64_t e = g * size + i;
      const float key = bias ? p[e] + bias[e] : p[e];
      if (i == 0 || key > first) {
        second = i == 0 ? second : first;
        first = key;
      } else if (i == 1 || key > second) {
        second = key;
      }
    }
    group_score[g] = first + second;
    chosen[g] = false;
  }
  for (int64_t j = 0; j < group_topk; ++j) {
    int64_t best = -1;
    for (int64_t g = 0; g < groups; ++g)
      if (!chosen[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
    chosen[best] = true;
  }
}

// The k largest of p[0..E) + bias[0..E) (bias may be null; ties: the lower expert index first), in
// descending order, into idx; their p (never the bias) into weight, renormalised to sum to 1 when
// `normalize`. k <= E. groups > 1: only among the experts topk_groups_row keeps (the others' key
// is 0).
MOE_HD void topk_row(const float* p, int64_t num_experts, int64_t k, bool normalize, int32_t* idx,
                     float* weight, const float* bias = nullptr, int64_t groups = 1,
                     int64_t group_topk = 1) {
  const bool grouped = groups > 1;
  const int64_t group_size = num_experts / groups;
  bool chosen[kMaxRouterGroups];
  if (grouped) topk_groups_row(p, bias, num_experts, groups, group_topk, chosen);
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    float best_key = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || idx[i] == e;
      if (taken) continue;
      float key = bias ? p[e] + bias[e] : p[e];
      if (grouped && !chosen[e / group_size]) key = 0.0f;
      if (best < 0 || key > best_key) {
        best = e;
        best_key = key;
      }
    }
    idx[j] = static_cast<int32_t>(best);
    weight[j] = p[best];
  }
  if (normalize) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += weight[j];
    if (sum > 0.0f) {
      float inv = 1.0f / sum;
      for (int64_t j = 0; j < k; ++j) weight[j] *= inv;
    }
  }
}

// d loss / d logits of one router row, from
//   dweight [k]   d loss / d (gate weight of choice j) (0 for choices dropped by capacity),
//   aux_coef [E]  d loss / d probs[e] through the aux loss (aux_scale * E * f_e / N), may be null,
//   z_coef        d loss / d lse of this row through the z loss (z_scale * 2 * lse / N).
// p [E] are the row's probabilities, idx [k] its choices. Writes dlogits [E].
// Adds d loss / d p[e] through the gate weights (topk_row's weights from p) into dp [E].
MOE_HD void gate_backward_row(const float* p, const int32_t* idx, const float* dweight, int64_t k,
                              bool normalize, float* dp) {
  if (normalize) {
    // w_j = p_j / S, S = sum of the chosen p: d/dp_i = (dw_i - sum_j dw_j w_j) / S
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += p[idx[j]];
    if (sum > 0.0f) {
      float inv = 1.0f / sum;
      float mean = 0.0f;
      for (int64_t j = 0; j < k; ++j) mean += dweight[j] * p[idx[j]] * inv;
      for (int64_t j = 0; j < k; ++j) dp[idx[j]] += (dweight[j] - mean) * inv;
    }
  } else {
    for (int64_t j = 0; j < k; ++j) dp[idx[j]] += dweight[j];
  }
}

MOE_HD void router_backward_row(const float* p, int64_t num_experts, const int32_t* idx,
                                const float* dweight, int64_t k, bool normalize,
                                const float* aux_coef, float z_coef, float* dlogits) {
  float* dp = dlogits;  // d loss / d probs, then turned into d loss / d logits in place
  for (int64_t e = 0; e < num_experts; ++e) dp[e] = aux_coef ? aux_coef[e] : 0.0f;
  gate_backward_row(p, idx, dweight, k, normalize, dp);
  softmax_backward_row(p, dp, dlogits, num_experts);
  // d lse / d logits = p
  for (int64_t e = 0; e < num_experts; ++e) dlogits[e] += z_coef * p[e];
}

// The sigmoid counterpart of router_backward_row: s [E] the row's sigmoid scores, logits [E] and
// lse its logits and their logsumexp (z loss), aux_coef [E] d loss / d probs[e] where probs are the
// normalised scores q = s / S. Writes dlogits [E]:
//   d/ds_i = gates' part + (aux_coef[i] - sum_e aux_coef[e] q_e) / S,
//   dlogits_i = d/ds_i * s_i (1 - s_i) + z_coef * exp(logits_i - lse).
MOE_HD void router_backward_sigmoid_row(const float* s, const float* logits, float lse,
                                        int64_t num_experts, const int32_t* idx,
                                        const float* dweight, int64_t k, bool normalize,
                                        const float* aux_coef, float z_coef, float* dlogits) {
  float* ds = dlogits;  // d loss / d scores, then turned into d loss / d logits in place
  for (int64_t e = 0; e < num_experts; ++e) ds[e] = 0.0f;
  if (aux_coef) {
    float sum = 0.0f, dot = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) {
      sum += s[e];
      dot += aux_coef[e] * s[e];
    }
    const float inv = 1.0f / sum;
    dot *= inv;  // sum_e aux_coef[e] q_e
    for (int64_t e = 0; e < num_experts; ++e) ds[e] = (aux_coef[e] - dot) * inv;
  }
  gate_backward_row(s, idx, dweight, k, normalize, ds);
  for (int64_t e = 0; e < num_experts; ++e)
    dlogits[e] = ds[e] * s[e] * (1.0f - s[e]) + z_coef * expf(logits[e] - lse);
}

}  // namespace moe::kernels
