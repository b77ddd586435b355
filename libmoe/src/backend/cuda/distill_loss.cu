// CUDA distillation loss: per-row values on the device, copied back for the host's fp64 means.
#include "backend/cuda/distill_loss.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_ops.h"
#include "backend/cuda/runtime.h"

namespace moe::cuda {

std::vector<kernels::DistillRow> distill_loss_rows(const Tensor& student, const Tensor& teacher,
                                                   const Tensor& targets, float temperature,
                                                   float ce_weight, float kd_weight,
                                                   Tensor* dlogits, float grad_scale) {
  const int64_t rows = student.dim(0), vocab = student.dim(1);
  std::vector<kernels::DistillRow> out(static_cast<size_t>(rows));
  if (rows == 0) return out;
  const int device = student.device().index;
  use_device(device);
  static_assert(sizeof(kernels::DistillRow) == 2 * sizeof(float));
  Tensor buffer = Tensor::empty({rows, 2}, DType::f32, student.device());
  launch<body::DistillLossRows>(launch_shape(rows), current_stream(device), student.data<float>(),
                                teacher.data<float>(), targets.data<int32_t>(), rows, vocab,
                                temperature, ce_weight, kd_weight,
                                dlogits ? dlogits->data<float>() : nullptr, grad_scale,
                                reinterpret_cast<kernels::DistillRow*>(buffer.data<float>()));
  copy_bytes(out.data(), -1, buffer.raw(), device, out.size() * sizeof(kernels::DistillRow));
  return out;
}

}  // namespace moe::cuda
