// Rotary position embedding, HF convention ("rotate half"): within one head of hd features the
// pairs are (i, i + hd/2) for i < hd/2, rotated by angle = position * theta^(-2i/hd):
//   y[i]        = x[i] cos - x[i + hd/2] sin
//   y[i + hd/2] = x[i + hd/2] cos + x[i] sin
// The backward is the inverse (transposed) rotation. With YaRN (moe/rope_scaling.h) the pairs'
// inverse frequencies are blended per pair and cos/sin carry an attention factor a: the map is a R,
// whose backward is a R^T (the same table, inverse = true). Partial rotary (GLM-4-MoE,
// partial_rotary_factor): only the first rd features of each head are rotated, with hd replaced by
// rd above (pairs (i, i + rd/2), angle theta^(-2i/rd)); the other hd - rd features pass through
// unchanged.
#pragma once
#include "kernels/common.h"

namespace moe::kernels {

// Inverse frequency of pair i (fp32 throughout, in the order of transformers' float32 tensor ops,
// so that the table holds what HF's cos/sin cache holds). factor 1: plain RoPE; else YaRN's blend
// (moe/rope_scaling.h): the trained frequency below ramp_low, it / factor past ramp_low +
// ramp_width.
MOE_HD float rope_inv_freq(int64_t i, int64_t head_dim, float theta, float factor = 1.0f,
                           float ramp_low = 0.0f, float ramp_width = 1.0f) {
  const float pos_freq = powf(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  const float extrapolation = 1.0f / pos_freq;
  if (factor == 1.0f) return extrapolation;
  const float interpolation = 1.0f / (factor * pos_freq);
  float ramp = (static_cast<float>(i) - ramp_low) / ramp_width;
  ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
  const float keep = 1.0f - ramp;  // the weight of the trained (extrapolation) frequency
  return interpolation * (1.0f - keep) + extrapolation * keep;
}

// Angle of pair i at `position` (fp32 throughout, as HF computes its cos/sin cache).
MOE_HD float rope_angle(int64_t position, int64_t i, int64_t head_dim, float theta) {
  return static_cast<float>(position) * rope_inv_freq(i, head_dim, theta);
}

// One entry of the cos/sin table: pair i at `position`, with YaRN's blend (factor, ramp_low,
// ramp_width; factor 1: plain) and attention factor (1: none; x 1.0f keeps the bits).
MOE_HD void rope_table_entry(int64_t position, int64_t i, int64_t rotary_dim, float theta,
                             float factor, float ramp_low, float ramp_width, float attention_factor,
                             float* cos_out, float* sin_out) {
  const float angle = static_cast<float>(position) *
                      rope_inv_freq(i, rotary_dim, theta, factor, ramp_low, ramp_width);
  *cos_out = cosf(angle) * attention_factor;
  *sin_out = sinf(angle) * attention_factor;
}

// Rotates the first rotary_dim features of one head (head_dim features) with precomputed cos/sin
// of its rotary_dim/2 pairs, and copies the rest. `y` may alias `x`.
// inverse = true applies the transposed rotation (the backward of the forward one).
MOE_HD void rope_rotate_head(const float* x, float* y, const float* cos_table,
                             const float* sin_table, int64_t rotary_dim, int64_t head_dim,
                             bool inverse) {
  const int64_t half = rotary_dim / 2;
  if (y != x)
    for (int64_t i = rotary_dim; i < head_dim; ++i) y[i] = x[i];
  for (int64_t i = 0; i < half; ++i) {
    const float c = cos_table[i];
    const float s = inverse ? -sin_table[i] : sin_table[i];
    const float a = x[i], b = x[i + half];
    y[i] = a * c - b * s;
    y[i + half] = b * c + a * s;
  }
}

}  // namespace moe::kernels
