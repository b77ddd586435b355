// Kernel bodies of the experts' bias / activation ops (grid.h): one thread per element of the
// permuted buffer [M, F] (the kernels/router.h row bodies on rows of length 1), the expert of a
// row found by binary search over the segment offsets [E+1]; the bias gradient one thread per
// (expert, column), summing the segment's rows in order.
#pragma once
#include "backend/cuda/grid.h"
#include "kernels/experts.h"

namespace moe::cuda::body {

// The expert whose segment holds `row`: the last e with offsets[e] <= row (empty segments are
// skipped), as std::upper_bound(offsets, offsets + E + 1, row) - offsets - 1.
MOE_HD int64_t expert_of_row(const int32_t* offsets, int64_t experts, int64_t row) {
  int64_t lo = 0, hi = experts + 1;  // first index with offsets[index] > row, in [lo, hi]
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (offsets[mid] > row) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo - 1;
}

// gelu (h3 null): h += b[e], a = gelu(h); swiglu: h += b[e], a = silu(h) * h3. bias may be null.
struct ExpertActivation {
  MOE_HD static void run(Thread th, float* h, const float* h3, const float* bias,
                         const int32_t* offsets, int64_t experts, int64_t width, float* a,
                         int64_t n) {
    MOE_GRID_LOOP(i, n, th) {
      const float* b = nullptr;
      if (bias) b = bias + expert_of_row(offsets, experts, i / width) * width + i % width;
      if (h3) {
        kernels::bias_swiglu_row(h + i, h3 + i, b, a + i, 1);
      } else {
        kernels::bias_gelu_row(h + i, b, a + i, 1);
      }
    }
  }
};

// gelu (h3 null): dh = da gelu'(h); swiglu: dh = da h3 silu'(h), dh3 = da silu(h).
struct ExpertActivationBackward {
  MOE_HD static void run(Thread th, const float* da, const float* h, const float* h3, float* dh,
                         float* dh3, int64_t n) {
    MOE_GRID_LOOP(i, n, th) {
      if (h3) {
        kernels::swiglu_backward_row(h + i, h3 + i, da + i, dh + i, dh3 + i, 1);
      } else {
        kernels::gelu_backward_row(h + i, da + i, dh + i, 1);
      }
    }
  }
};

// y[row, c] += bias[e, c].
struct GroupedAddBias {
  MOE_HD static void run(Thread th, float* y, const float* bias, const int32_t* offsets,
                         int64_t experts, int64_t width, int64_t n) {
    MOE_GRID_LOOP(i, n, th) {
      const int64_t e = expert_of_row(offsets, experts, i / width);
      kernels::add_row(y + i, bias + e * width + i % width, 1);
    }
  }
};

// dbias[e, c] += (sum over the rows of segment e, in order, of dy[row, c]); one thread per (e, c).
struct GroupedBiasGrad {
  MOE_HD static void run(Thread th, const float* dy, const int32_t* offsets, int64_t experts,
                         int64_t width, float* dbias) {
    MOE_GRID_LOOP(i, experts * width, th) {
      const int64_t e = i / width, c = i % width;
      const float acc = kernels::add_strided(0.0f, dy + int64_t{offsets[e]} * width + c,
                                             offsets[e + 1] - offsets[e], width);
      kernels::add_row(dbias + i, &acc, 1);
    }
  }
};

}  // namespace moe::cuda::body
