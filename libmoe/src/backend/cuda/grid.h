// One thread's place in a 1-D launch, and the CPU harness that runs a kernel body over a whole
// grid. Every CUDA kernel of the backend is a body struct with a static MOE_HD `run(Thread, ...)`
// that uses no block-level barrier and no shared memory: the device kernel (launch.cuh) calls it
// with blockIdx/threadIdx, and tests call run_grid_on_cpu with the same arguments, so the exact
// index mapping of every kernel is exercised on machines without a GPU.
#pragma once
#include <cstdint>

#include "kernels/common.h"

namespace moe::cuda {

struct Thread {
  int64_t block = 0, thread = 0, block_dim = 1, grid_dim = 1;
  MOE_HD int64_t global() const { return block * block_dim + thread; }
  MOE_HD int64_t stride() const { return grid_dim * block_dim; }
};

// Grid-stride loop over [0, n): every index is visited by exactly one thread of the grid.
#define MOE_GRID_LOOP(i, n, th) \
  for (int64_t i = (th).global(), moe_n_ = (n); i < moe_n_; i += (th).stride())

// Launch shape for n work items: 256 threads per block, at most `max_blocks` blocks (the
// grid-stride loops cover the rest).
struct LaunchShape {
  int64_t blocks = 1, threads = 256;
};
inline LaunchShape launch_shape(int64_t n, int64_t threads = 256, int64_t max_blocks = 65535) {
  LaunchShape s;
  s.threads = threads;
  int64_t b = (n + threads - 1) / threads;
  s.blocks = b < 1 ? 1 : (b > max_blocks ? max_blocks : b);
  return s;
}

// Runs Body::run over every (block, thread) of a grid on the calling CPU thread, in order.
template <class Body, class... Args>
void run_grid_on_cpu(LaunchShape shape, Args... args) {
  for (int64_t b = 0; b < shape.blocks; ++b)
    for (int64_t t = 0; t < shape.threads; ++t)
      Body::run(Thread{b, t, shape.threads, shape.blocks}, args...);
}

}  // namespace moe::cuda
