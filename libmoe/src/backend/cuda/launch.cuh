// The one __global__ template every backend kernel goes through: it builds the thread's Thread
// from blockIdx/threadIdx and calls the body (grid.h). launch<Body>(shape, stream, args...) starts
// it on a stream and checks the launch.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/check.h"
#include "backend/cuda/grid.h"

namespace moe::cuda {

template <class Body, class... Args>
__global__ void grid_kernel(Args... args) {
  Body::run(Thread{static_cast<int64_t>(blockIdx.x), static_cast<int64_t>(threadIdx.x),
                   static_cast<int64_t>(blockDim.x), static_cast<int64_t>(gridDim.x)},
            args...);
}

template <class Body, class... Args>
void launch(LaunchShape shape, cudaStream_t stream, Args... args) {
  grid_kernel<Body, Args...>
      <<<static_cast<unsigned>(shape.blocks), static_cast<unsigned>(shape.threads), 0, stream>>>(
          args...);
  MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda
