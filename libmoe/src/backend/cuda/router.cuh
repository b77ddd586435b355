// Kernel bodies of the router ops (grid.h): jitter and its backward one thread per element;
// softmax, top-k and the router row backward one thread per token row (the kernels/router.h row
// bodies). Compiled by nvcc for the device and by the host compiler for the CPU harness tests.
#pragma once
#include "backend/cuda/grid.h"
#include "kernels/router.h"

namespace moe::cuda::body {

// noise[i] = jitter factor of element first_row * cols + i; routed[i] = x[i] * noise[i].
struct RouterJitter {
  MOE_HD static void run(Thread th, const float* x, float jitter, uint64_t key, float* noise,
                         float* routed, int64_t first_row, int64_t cols, int64_t n) {
    MOE_GRID_LOOP(i, n, th) {
      const int64_t t = i / cols, d = i % cols;
      float f =
          kernels::jitter_factor(key, static_cast<uint64_t>((first_row + t) * cols + d), jitter);
      noise[i] = f;
      routed[i] = x[i] * f;
    }
  }
};

struct RouterJitterBackward {
  MOE_HD static void run(Thread th, const float* noise, float* dx, int64_t n) {
    MOE_GRID_LOOP(i, n, th) { dx[i] *= noise[i]; }
  }
};

struct RouterSoftmax {
  MOE_HD static void run(Thread th, const float* logits, float* probs, float* lse, int64_t rows,
                         int64_t experts) {
    MOE_GRID_LOOP(t, rows, th) {
      lse[t] = kernels::softmax_row(logits + t * experts, probs + t * experts, experts);
    }
  }
};

// bias [E] (may be null) shifts the choice, not the weights.
struct RouterTopk {
  MOE_HD static void run(Thread th, const float* probs, int64_t rows, int64_t experts, int64_t k,
                         bool normalize, int32_t* idx, float* weight, const float* bias,
                         int64_t groups, int64_t group_topk) {
    MOE_GRID_LOOP(t, rows, th) {
      kernels::topk_row(probs + t * experts, experts, k, normalize, idx + t * k, weight + t * k,
                        bias, groups, group_topk);
    }
  }
};

// aux_coef [E] is shared by every row; the z-loss coefficient of row t is z_factor * lse[t].
struct RouterBackward {
  MOE_HD static void run(Thread th, const float* probs, const float* lse, const int32_t* idx,
                         const float* dweight, int64_t rows, int64_t experts, int64_t k,
                         bool normalize, const float* aux_coef, float z_factor, float* dlogits) {
    MOE_GRID_LOOP(t, rows, th) {
      kernels::router_backward_row(probs + t * experts, experts, idx + t * k, dweight + t * k, k,
                                   normalize, aux_coef, z_factor * lse[t], dlogits + t * experts);
    }
  }
};

struct RouterSigmoid {
  MOE_HD static void run(Thread th, const float* logits, float* scores, float* probs, float* lse,
                         int64_t rows, int64_t experts) {
    MOE_GRID_LOOP(t, rows, th) {
      lse[t] = kernels::sigmoid_row(logits + t * experts, scores + t * experts, probs + t * experts,
                                    experts);
    }
  }
};

struct RouterBackwardSigmoid {
  MOE_HD static void run(Thread th, const float* scores, const float* logits, const float* lse,
                         const int32_t* idx, const float* dweight, int64_t rows, int64_t experts,
                         int64_t k, bool normalize, const float* aux_coef, float z_factor,
                         float* dlogits) {
    MOE_GRID_LOOP(t, rows, th) {
      kernels::router_backward_sigmoid_row(scores + t * experts, logits + t * experts, lse[t],
                                           experts, idx + t * k, dweight + t * k, k, normalize,
                                           aux_coef, z_factor * lse[t], dlogits + t * experts);
    }
  }
};

// Router centring (kernels::center_norm2): three grid loops, one launch each. scratch holds E + 1
// doubles: the projections p_e, then |c|^2. Project: one thread per expert (and one for |c|^2).
struct RouterCenterProject {
  MOE_HD static void run(Thread th, const float* w, const float* c, int64_t experts, int64_t d,
                         double* scratch) {
    MOE_GRID_LOOP(e, experts + 1, th) {
      const double cc = kernels::center_norm2(c, d);
      if (e == experts)
        scratch[e] = cc;
      else
        scratch[e] = cc == 0 ? 0.0 : kernels::center_projection(w + e * d, c, d, cc);
    }
  }
};

// k_e = p_e - the mean of p (each thread sums every p in order, as the CPU's loop).
struct RouterCenterShift {
  MOE_HD static void run(Thread th, const double* scratch, int64_t experts, float* k) {
    MOE_GRID_LOOP(e, experts, th) {
      k[e] = kernels::center_shift(scratch[e], kernels::center_mean(scratch, experts));
    }
  }
};

// W'[e, i] = W[e, i] - k_e c[i], or W[e, i] itself when c = 0.
struct RouterCenterApply {
  MOE_HD static void run(Thread th, const float* w, const float* c, const double* scratch,
                         const float* k, int64_t experts, int64_t d, float* out) {
    const bool zero = scratch[experts] == 0;
    MOE_GRID_LOOP(i, experts * d, th) {
      out[i] = zero ? w[i] : kernels::centred_element(w[i], k[i / d], c[i % d]);
    }
  }
};

// One thread per element; y may alias x, dx may alias dy.
struct Sigmoid {
  MOE_HD static void run(Thread th, const float* x, float* y, int64_t n) {
    MOE_GRID_LOOP(i, n, th) { y[i] = kernels::sigmoid(x[i]); }
  }
};

struct SigmoidBackward {
  MOE_HD static void run(Thread th, const float* dy, const float* y, float* dx, int64_t n) {
    MOE_GRID_LOOP(i, n, th) { dx[i] = dy[i] * y[i] * (1.0f - y[i]); }
  }
};

}  // namespace moe::cuda::body
