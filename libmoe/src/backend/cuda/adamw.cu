// CUDA optimizer kernels: the AdamW element update and the in-place gradient scale of clipping.
#include "backend/cuda/adamw.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_ops.h"
#include "backend/cuda/runtime.h"
#include "moe/error.h"

namespace moe::cuda {

void adamw_update(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                  const kernels::AdamWScalars& scalars) {
  const int64_t n = master.numel();
  MOE_CHECK(m.numel() == n && v.numel() == n && grad.numel() == n,
            "cuda adamw: ", master.describe(), " with ", m.describe(), ", ", v.describe(), ", ",
            grad.describe());
  if (n == 0) return;
  const int device = master.device().index;
  use_device(device);
  launch<body::AdamWUpdate>(launch_shape(n), current_stream(device), master.data<float>(),
                            m.data<float>(), v.data<float>(), grad.data<float>(), scalars, n);
}

void scale_in_place(Tensor& x, float scale) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const int device = x.device().index;
  use_device(device);
  launch<body::ScaleInPlace>(launch_shape(n), current_stream(device), x.data<float>(), scale, n);
}

}  // namespace moe::cuda
