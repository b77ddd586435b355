// Rotary position embedding over [B*T, heads*hd] activations (HF "rotate half" convention).
// A cos/sin table [T, hd/2] is built once per call; rows are rotated in parallel.
#include "kernels/rope.h"

#include <vector>

#include "backend/cpu/parallel.h"
#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#ifdef MOE_HAVE_CUDA
#include "backend/cuda/dense_ops.h"
#endif

namespace moe::ops {

namespace {
// Loops over fewer elements than this run on the calling thread: a fork/join costs more.

void rope_apply(const char* op, const Tensor& x, int64_t batch, int64_t seq, int64_t heads,
                float theta, Tensor& y, int64_t position_offset, bool inverse) {
  [[maybe_unused]] const Device device = require_backend(op, {&x, &y});
  MOE_CHECK(x.ndim() == 2, op, ": input ", x.describe(), " is not 2-D [B*T, H*hd]");
  x.expect_dtype(DType::f32, op);
  MOE_CHECK(batch >= 0 && seq >= 0 && heads > 0 && x.dim(0) == batch * seq && x.dim(1) % heads == 0,
            op, ": input ", x.describe(), " does not match batch ", batch, ", seq ", seq,
            ", heads ", heads);
  const int64_t width = x.dim(1), head_dim = width / heads, half = head_dim / 2;
  MOE_CHECK(head_dim % 2 == 0, op, ": head dim ", head_dim, " of ", x.describe(), " is odd");
  MOE_CHECK(theta > 0.0f && position_offset >= 0, op, ": theta ", theta, ", position offset ",
            position_offset);
  y.expect_shape(x.shape(), op);
  y.expect_dtype(DType::f32, op);
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda)
    return cuda::rope_apply(x, batch, seq, heads, theta, y, position_offset, inverse);
#endif

  std::vector<float> cos_table(static_cast<size_t>(seq * half)),
      sin_table(static_cast<size_t>(seq * half));
#pragma omp parallel for schedule(static) if (seq * half >= cpu::kParallelWork)
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = kernels::rope_angle(position_offset + t, i, head_dim, theta);
      cos_table[t * half + i] = cosf(angle);
      sin_table[t * half + i] = sinf(angle);
    }
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  const int64_t rows = batch * seq;
#pragma omp parallel for schedule(static) if (rows * width >= cpu::kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % seq;
    for (int64_t h = 0; h < heads; ++h)
      kernels::rope_rotate_head(xs + r * width + h * head_dim, ys + r * width + h * head_dim,
                                cos_table.data() + t * half, sin_table.data() + t * half, head_dim,
                                inverse);
  }
}

}  // namespace

void rope_forward(const Tensor& x, int64_t batch, int64_t seq, int64_t heads, float theta,
                  Tensor& y, int64_t position_offset) {
  rope_apply("rope_forward", x, batch, seq, heads, theta, y, position_offset, false);
}

void rope_backward(const Tensor& dy, int64_t batch, int64_t seq, int64_t heads, float theta,
                   Tensor& dx, int64_t position_offset) {
  rope_apply("rope_backward", dy, batch, seq, heads, theta, dx, position_offset, true);
}

}  // namespace moe::ops
