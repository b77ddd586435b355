// CUDA rotary position embedding (bodies in rope.cuh).
#include "backend/cuda/dense_ops.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/runtime.h"

namespace moe::cuda {

void rope_apply(const Tensor& x, int64_t batch, int64_t seq, int64_t heads, int64_t rotary_dim,
                float theta, const ops::RopeScaling& scaling, Tensor& y, int64_t position_offset,
                bool inverse) {
  const int64_t rows = batch * seq, head_dim = x.dim(1) / heads, half = rotary_dim / 2;
  if (rows == 0 || half == 0) return;
  const int device = y.device().index;
  use_device(device);
  cudaStream_t stream = current_stream(device);
  Tensor table = Tensor::empty({2, seq * half}, DType::f32, y.device());
  float* cos_table = table.data<float>();
  float* sin_table = cos_table + seq * half;
  launch<body::RopeTable>(launch_shape(seq * half), stream, cos_table, sin_table, seq, half,
                          rotary_dim, theta, position_offset, scaling);
  launch<body::RopeRotate>(launch_shape(rows * heads), stream, x.data<float>(), y.data<float>(),
                           static_cast<const float*>(cos_table),
                           static_cast<const float*>(sin_table), rows, seq, heads, rotary_dim,
                           head_dim, inverse);
}

}  // namespace moe::cuda
