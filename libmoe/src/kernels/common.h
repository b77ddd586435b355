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

// The fixed tree that closes kReduceLanes partial sums (lane l adding elements l, l + 16, ...):
// lane l += lane l + h for h = 8, 4, 2, 1; lane is overwritten. The CPU's decode GEMV and decode
// dot products (gemv_detail::reduce_lanes) and the attention softmax rows on the CPU and the GPU
// all close their lanes by it, so their sums have one order.
inline constexpr int64_t kReduceLanes = 16;
MOE_HD float reduce_lanes(float* lane) {
  for (int64_t h = kReduceLanes / 2; h >= 1; h /= 2)
    for (int64_t l = 0; l < h; ++l) lane[l] += lane[l + h];
  return lane[0];
}

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
