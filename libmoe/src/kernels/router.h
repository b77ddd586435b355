// Kernel bodies of the router, one token row at a time: Switch jitter, top-k selection and
// renormalisation, and the gate/softmax/aux/z backward of a row.
// Shapes: N tokens, D model width, E experts, k experts per token.
#pragma once
#include "kernels/common.h"
#include "kernels/philox.h"
#include "kernels/softmax.h"

namespace moe::kernels {

// Switch jitter: a factor uniform in (1 - jitter, 1 + jitter), a pure function of (key, index).
MOE_HD float jitter_factor(uint64_t key, uint64_t index, float jitter) {
  float u = uniform_from_bits(philox4x32(key, index).v[0]);
  return (1.0f - jitter) + 2.0f * jitter * u;
}

// The k largest of p[0..E) (ties: the lower expert index first), in descending order, into idx;
// their probabilities into weight, renormalised to sum to 1 when `normalize`. k <= E.
MOE_HD void topk_row(const float* p, int64_t num_experts, int64_t k, bool normalize, int32_t* idx,
                     float* weight) {
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < num_experts; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || idx[i] == e;
      if (taken) continue;
      if (best < 0 || p[e] > p[best]) best = e;
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
MOE_HD void router_backward_row(const float* p, int64_t num_experts, const int32_t* idx,
                                const float* dweight, int64_t k, bool normalize,
                                const float* aux_coef, float z_coef, float* dlogits) {
  float* dp = dlogits;  // d loss / d probs, then turned into d loss / d logits in place
  for (int64_t e = 0; e < num_experts; ++e) dp[e] = aux_coef ? aux_coef[e] : 0.0f;
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
  softmax_backward_row(p, dp, dlogits, num_experts);
  // d lse / d logits = p
  for (int64_t e = 0; e < num_experts; ++e) dlogits[e] += z_coef * p[e];
}

}  // namespace moe::kernels
