// [cuda] tests: each TEST_CASE tagged [cuda] starts with MOE_REQUIRE_CUDA_DEVICE(). Where no CUDA
// device is usable it prints "[cuda] skipped: <why>" and returns; ctest matches that line
// (SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt) and reports the test as skipped, not passed.
#pragma once
#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

#include "backend/cuda/grid.h"
#include "moe/cuda.h"
#include "moe/tensor.h"
#include "support/gradcheck.h"

#define MOE_REQUIRE_CUDA_DEVICE()                                                   \
  do {                                                                              \
    if (!::moe::cuda::available()) {                                                \
      std::cout << "[cuda] skipped: " << ::moe::cuda::unavailable_reason() << "\n"; \
      return;                                                                       \
    }                                                                               \
  } while (0)

namespace moe::test {

// max |a - b| / max(max |b|, tiny): the normalised error [cuda] tests compare with a tolerance.
inline double normalised_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return a.size() == b.size() ? diff / scale : 1e30;
}

// Launch shapes the [cuda-harness] tests run every kernel body over: a grid smaller than the work
// (grid-stride loops wrap), a single thread, and more threads than items.
inline constexpr cuda::LaunchShape kHarnessGrids[] = {{3, 32}, {1, 1}, {64, 256}};

// The int32 values of a tensor on any device.
inline std::vector<int32_t> int_values(const Tensor& t) {
  const Tensor h = t.to(Device{});
  const int32_t* p = h.data<int32_t>();
  return std::vector<int32_t>(p, p + h.numel());
}

// Router logits [rows, experts] on a coarse grid (multiples of 1/2), so that top-k meets ties.
inline Tensor router_logits(int64_t rows, int64_t experts, uint64_t seed) {
  std::vector<float> v = random_tensor({rows, experts}, seed, 2.0f).to_vector();
  for (float& x : v) x = std::round(x * 2.0f) / 2.0f;
  return Tensor::from_vector({rows, experts}, v);
}

}  // namespace moe::test
