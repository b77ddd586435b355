// Kernel bodies of dispatch / combine (grid.h): the gather and slot_to_choice one thread per
// element, combine one thread per token row and its backward one thread per slot row (the
// kernels/router.h row bodies, sums in choice order). Ids were validated on the host when the
// routing table was built; out-of-range ids are skipped rather than read out of bounds.
#pragma once
#include "backend/cuda/grid.h"
#include "kernels/dispatch.h"

namespace moe::cuda::body {

// x_perm[s, d] = x[token_of_slot[s], d] over the M*D elements.
struct GatherRows {
  MOE_HD static void run(Thread th, const float* x, const int32_t* token_of_slot, int64_t tokens,
                         int64_t width, float* x_perm, int64_t n) {
    MOE_GRID_LOOP(i, n, th) {
      const int64_t s = i / width, d = i % width;
      const int32_t t = token_of_slot[s];
      if (t >= 0 && t < tokens) kernels::copy_row(x + t * width + d, x_perm + i, 1);
    }
  }
};

// y[t] = combine_row over token t's k slots; weight_of_slot null = weight 1.
struct CombineRows {
  MOE_HD static void run(Thread th, const float* rows, const int32_t* slot_of,
                         const float* weight_of_slot, int64_t tokens, int64_t k, int64_t width,
                         float* y) {
    MOE_GRID_LOOP(t, tokens, th) {
      kernels::combine_row(rows, slot_of + t * k, weight_of_slot, k, width, y + t * width);
    }
  }
};

// dy_perm[s] = w[s] dy[token_of_slot[s]], dweight_of_slot[s] = <dy[token], y_perm[s]>.
struct CombineRowsBackward {
  MOE_HD static void run(Thread th, const float* dy, const float* y_perm,
                         const int32_t* token_of_slot, const float* weight_of_slot, int64_t tokens,
                         int64_t slots, int64_t width, float* dy_perm, float* dweight_of_slot) {
    MOE_GRID_LOOP(s, slots, th) {
      const int32_t t = token_of_slot[s];
      if (t < 0 || t >= tokens) continue;
      dweight_of_slot[s] =
          kernels::combine_backward_row(dy + static_cast<int64_t>(t) * width, y_perm + s * width,
                                        weight_of_slot[s], width, dy_perm + s * width);
    }
  }
};

// dtopk_weight[a] = dweight_of_slot[slot_of[a]], 0 where the choice was dropped (slot -1).
struct SlotToChoice {
  MOE_HD static void run(Thread th, const float* dweight_of_slot, const int32_t* slot_of,
                         int64_t slots, float* dtopk_weight, int64_t n) {
    MOE_GRID_LOOP(a, n, th) {
      const int32_t s = slot_of[a];
      dtopk_weight[a] = s >= 0 && s < slots ? dweight_of_slot[s] : 0.0f;
    }
  }
};

}  // namespace moe::cuda::body
