// [cuda] tests: each TEST_CASE tagged [cuda] starts with MOE_REQUIRE_CUDA_DEVICE(). Where no CUDA
// device is usable it prints "[cuda] skipped: <why>" and returns; ctest matches that line
// (SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt) and reports the test as skipped, not passed.
#pragma once
#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

#include "moe/cuda.h"

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

}  // namespace moe::test
