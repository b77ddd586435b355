// LayerNorm and RMSNorm over one row of D features (fp32), and their backward.
// LayerNorm: y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps) (biased variance).
// RMSNorm:   y = x * rstd * w,              rstd = 1 / sqrt(mean(x^2) + eps).
// Parameter gradients are accumulated by the caller over rows in a fixed order, a column range
// at a time (norm_param_grad_row), so they never depend on how rows were split across threads.
#pragma once
#include "kernels/common.h"

namespace moe::kernels {

// Two passes (mean, then centred variance) so large offsets do not cancel.
MOE_HD void layernorm_row(const float* x, const float* w, const float* b, float* y, int64_t n,
                          float eps, float* mean_out, float* rstd_out) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += x[j];
  const float mean = sum / static_cast<float>(n);
  float sq = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    float c = x[j] - mean;
    sq += c * c;
  }
  const float rstd = 1.0f / sqrtf(sq / static_cast<float>(n) + eps);
  for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - mean) * rstd * w[j] + (b ? b[j] : 0.0f);
  *mean_out = mean;
  *rstd_out = rstd;
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w, xhat = (x - mean) * rstd.
MOE_HD void layernorm_row_backward(const float* dy, const float* x, const float* w, float mean,
                                   float rstd, float* dx, int64_t n) {
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    float g = dy[j] * w[j];
    sum_g += g;
    sum_gx += g * (x[j] - mean) * rstd;
  }
  const float inv_n = 1.0f / static_cast<float>(n);
  const float mean_g = sum_g * inv_n, mean_gx = sum_gx * inv_n;
  for (int64_t j = 0; j < n; ++j) {
    float xhat = (x[j] - mean) * rstd;
    dx[j] = rstd * (dy[j] * w[j] - mean_g - xhat * mean_gx);
  }
}

MOE_HD void rmsnorm_row(const float* x, const float* w, float* y, int64_t n, float eps,
                        float* rstd_out) {
  float sq = 0.0f;
  for (int64_t j = 0; j < n; ++j) sq += x[j] * x[j];
  const float rstd = 1.0f / sqrtf(sq / static_cast<float>(n) + eps);
  for (int64_t j = 0; j < n; ++j) y[j] = x[j] * rstd * w[j];
  *rstd_out = rstd;
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd.
MOE_HD void rmsnorm_row_backward(const float* dy, const float* x, const float* w, float rstd,
                                 float* dx, int64_t n) {
  float sum_gx = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum_gx += dy[j] * w[j] * x[j] * rstd;
  const float mean_gx = sum_gx / static_cast<float>(n);
  for (int64_t j = 0; j < n; ++j) dx[j] = rstd * (dy[j] * w[j] - x[j] * rstd * mean_gx);
}

// One row's contribution to the norm parameter gradients over columns [j0, j1):
// dw[j] += dy[j] * xhat[j], db[j] += dy[j] (db may be null). mean = 0 for RMSNorm.
MOE_HD void norm_param_grad_row(const float* dy, const float* x, float mean, float rstd, int64_t j0,
                                int64_t j1, float* dw, float* db) {
  for (int64_t j = j0; j < j1; ++j) dw[j] += dy[j] * (x[j] - mean) * rstd;
  if (db)
    for (int64_t j = j0; j < j1; ++j) db[j] += dy[j];
}

}  // namespace moe::kernels
