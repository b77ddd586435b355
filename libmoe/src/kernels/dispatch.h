// Kernel bodies of dispatch and combine (the permuted buffer of the MoE layer), one row at a time.
// Shapes: N tokens, D model width, k experts per token, M = kept assignments (rows of the permuted
// buffer).
#pragma once
#include "kernels/common.h"

namespace moe::kernels {

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

}  // namespace moe::kernels
