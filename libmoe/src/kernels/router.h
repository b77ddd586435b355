// Kernel bodies of the MoE layer, one row at a time: router jitter, top-k selection and
// renormalisation, the gate/softmax/aux/z backward of a router row, the dispatch/combine rows and
// the experts' bias + activation rows.
// Shapes: N tokens, D model width, F expert hidden width, E experts, k experts per token,
// M = kept assignments (rows of the permuted buffer).
#pragma once
#include "kernels/activations.h"
#include "kernels/common.h"
#include "kernels/philox.h"
#include "kernels/softmax.h"

namespace moe::kernels {

// ---- router -------------------------------------------------------------------------------

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

// ---- dispatch / combine -------------------------------------------------------------------

MOE_HD void copy_row(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

// y = sum over the token's kept choices j (in order) of weight_of_slot[s] * rows[s], s = slots[j];
// a slot of -1 (dropped) contributes nothing. weight_of_slot null: weight 1 (dispatch backward).
MOE_HD void combine_row(const float* rows, const int32_t* slots, const float* weight_of_slot,
                        int64_t k, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    int32_t s = slots[j];
    if (s < 0) continue;
    const float* row = rows + static_cast<int64_t>(s) * n;
    float w = weight_of_slot ? weight_of_slot[s] : 1.0f;
    for (int64_t i = 0; i < n; ++i) y[i] += w * row[i];
  }
}

// Backward of one slot of combine: dy_perm = w * dy[token], returns d loss / d w = <dy, y_perm>.
MOE_HD float combine_backward_row(const float* dy, const float* y_perm, float weight, int64_t n,
                                  float* dy_perm) {
  float dot = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    dy_perm[i] = weight * dy[i];
    dot += dy[i] * y_perm[i];
  }
  return dot;
}

// ---- experts: bias and activation ---------------------------------------------------------

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
