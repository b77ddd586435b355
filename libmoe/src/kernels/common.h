// Single-source kernel bodies: MOE_HD functions are compiled for the CPU loops in backend/cpu and,
// under nvcc, for the CUDA kernels in backend/cuda. Keep them free of allocation, exceptions and
// std:: containers.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MOE_HD __host__ __device__ inline
#else
#define MOE_HD inline
#endif

namespace moe::kernels {

// acc + x[0] + x[stride] + ... + x[(n - 1) stride], added in that order. The loads run 16 rows
// ahead of the adds: a GPU thread that sums one column alone (the bias gradients) then waits one
// memory latency per 16 rows instead of one per row. The same bits as the plain loop.
MOE_HD float add_strided(float acc, const float* x, int64_t n, int64_t stride) {
  constexpr int kAhead = 16;
  int64_t i = 0;
  for (; i + kAhead <= n; i += kAhead) {
    float v[kAhead];
    for (int u = 0; u < kAhead; ++u) v[u] = x[(i + u) * stride];
    for (int u = 0; u < kAhead; ++u) acc += v[u];
  }
  for (; i < n; ++i) acc += x[i * stride];
  return acc;
}

}  // namespace moe::kernels
