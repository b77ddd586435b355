// Helpers for the determinism tests: bitwise tensor equality and a thread-count guard.
#pragma once
#include <cstring>

#include "moe/tensor.h"
#include "moe/threads.h"

namespace moe::test {

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Restores the thread count a test changed.
struct ThreadGuard {
  int before = num_threads();
  ~ThreadGuard() { set_num_threads(before); }
};

}  // namespace moe::test
