// Rotary position embedding over [B*T, heads*hd] activations (HF "rotate half" convention).
// A cos/sin table [T, hd/2] is built once per call; rows are rotated in parallel.
#include "kernels/rope.h"

#include <vector>

#include "backend/cpu/backend.h"
#include "core/parallel.h"

namespace moe::cpu {

void rope_apply(const Tensor& x, int64_t batch, int64_t seq, int64_t heads, float theta, Tensor& y,
                int64_t position_offset, bool inverse) {
  const int64_t width = x.dim(1), head_dim = width / heads, half = head_dim / 2;
  std::vector<float> cos_table(static_cast<size_t>(seq * half)),
      sin_table(static_cast<size_t>(seq * half));
#pragma omp parallel for schedule(static) if (seq * half >= kParallelWork)
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = kernels::rope_angle(position_offset + t, i, head_dim, theta);
      cos_table[t * half + i] = cosf(angle);
      sin_table[t * half + i] = sinf(angle);
    }
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  const int64_t rows = batch * seq;
#pragma omp parallel for schedule(static) if (rows * width >= kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % seq;
    for (int64_t h = 0; h < heads; ++h)
      kernels::rope_rotate_head(xs + r * width + h * head_dim, ys + r * width + h * head_dim,
                                cos_table.data() + t * half, sin_table.data() + t * half, head_dim,
                                inverse);
  }
}

}  // namespace moe::cpu
