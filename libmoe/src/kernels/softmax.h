// Row softmax / logsumexp in fp32 (max-subtracted), and the softmax backward.
#pragma once
#include "kernels/common.h"

namespace moe::kernels {

// out[j] = exp(x[j] - lse); returns lse = log sum_j exp(x[j]). `out` may alias `x`.
MOE_HD float softmax_row(const float* x, float* out, int64_t n) {
  float m = x[0];
  for (int64_t j = 1; j < n; ++j) m = x[j] > m ? x[j] : m;
  // The exponentials first, then their sum in index order. (The router's rows, E values; the
  // attention rows have their own body, kernels/attention.h.)
  for (int64_t j = 0; j < n; ++j) out[j] = expf(x[j] - m);
  float s = 0.0f;
  for (int64_t j = 0; j < n; ++j) s += out[j];
  float inv = 1.0f / s;
  for (int64_t j = 0; j < n; ++j) out[j] *= inv;
  return m + logf(s);
}

// dx[j] = p[j] * (dp[j] - sum_i p[i] dp[i]). `dx` may alias `dp`.
MOE_HD void softmax_backward_row(const float* p, const float* dp, float* dx, int64_t n) {
  float dot = 0.0f;
  for (int64_t j = 0; j < n; ++j) dot += p[j] * dp[j];
  for (int64_t j = 0; j < n; ++j) dx[j] = p[j] * (dp[j] - dot);
}

}  // namespace moe::kernels
