// Rotary position embedding, HF convention ("rotate half"): within one head of hd features the
// pairs are (i, i + hd/2) for i < hd/2, rotated by angle = position * theta^(-2i/hd):
//   y[i]        = x[i] cos - x[i + hd/2] sin
//   y[i + hd/2] = x[i + hd/2] cos + x[i] sin
// The backward is the inverse (transposed) rotation.
// Partial rotary (GLM-4-MoE, partial_rotary_factor): only the first rd features of each head are
// rotated, with hd replaced by rd above (pairs (i, i + rd/2), angle theta^(-2i/rd)); the other
// hd - rd features pass through unchanged.
#pragma once
#include "kernels/common.h"

namespace moe::kernels {

// Angle of pair i at `position` (fp32 throughout, as HF computes its cos/sin cache).
MOE_HD float rope_angle(int64_t position, int64_t i, int64_t head_dim, float theta) {
  float inv_freq = 1.0f / powf(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  return static_cast<float>(position) * inv_freq;
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
