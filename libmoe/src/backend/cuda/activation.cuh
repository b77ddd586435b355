// Kernel bodies of bias add / bias gradient and the GELU / SwiGLU activations (grid.h), and the
// experts' clamped SwiGLU (gpt-oss): one thread
// per element (kernels/activations.h), one thread per column over rows in order for bias_grad.
// Shapes: y, dy [N, C]; bias [C]; activations elementwise over n values.
#pragma once
#include "backend/cuda/grid.h"
#include "backend/cuda/grouped_gemm.cuh"
#include "kernels/activations.h"
#include "kernels/experts.h"

namespace moe::cuda::body {

struct BiasAdd {
  MOE_HD static void run(Thread th, float* y, const float* bias, int64_t n, int64_t c) {
    MOE_GRID_LOOP(e, n * c, th) { y[e] += bias[e % c]; }
  }
};

// dbias[j] += dy[i, j] for i = 0 .. n-1 in order.
struct BiasGrad {
  MOE_HD static void run(Thread th, const float* dy, float* dbias, int64_t n, int64_t c) {
    MOE_GRID_LOOP(j, c, th) { dbias[j] = kernels::add_strided(dbias[j], dy + j, n, c); }
  }
};

// y may alias x.
struct Gelu {
  MOE_HD static void run(Thread th, const float* x, float* y, int64_t n) {
    MOE_GRID_LOOP(i, n, th) { y[i] = kernels::gelu_tanh(x[i]); }
  }
};

// dx may alias dy.
struct GeluBackward {
  MOE_HD static void run(Thread th, const float* dy, const float* x, float* dx, int64_t n) {
    MOE_GRID_LOOP(i, n, th) { dx[i] = dy[i] * kernels::gelu_tanh_grad(x[i]); }
  }
};

struct Swiglu {
  MOE_HD static void run(Thread th, const float* gate, const float* up, float* y, int64_t n) {
    MOE_GRID_LOOP(i, n, th) { y[i] = kernels::silu(gate[i]) * up[i]; }
  }
};

// Outputs may alias inputs: each element's inputs are read before its outputs are written.
struct SwigluBackward {
  MOE_HD static void run(Thread th, const float* dy, const float* gate, const float* up,
                         float* dgate, float* dup, int64_t n) {
    MOE_GRID_LOOP(i, n, th) {
      const float g = dy[i], gate_i = gate[i], up_i = up[i];
      dgate[i] = g * up_i * kernels::silu_grad(gate_i);
      dup[i] = g * kernels::silu(gate_i);
    }
  }
};

// The experts' clamped SwiGLU (gpt-oss; kernels::bias_clamped_swiglu_row on rows of length 1):
// h += b[e] (bias may be null), a = (clamp(h3) + 1) * min(h, limit) sigmoid(alpha min(h, limit)).
// One thread per element of the permuted buffer [M, width]; the expert of a row as
// ExpertActivation finds it.
struct ClampedSwiglu {
  MOE_HD static void run(Thread th, float* h, const float* h3, const float* bias,
                         const int32_t* offsets, int64_t experts, int64_t width, float alpha,
                         float limit, float* a, int64_t n) {
    MOE_GRID_LOOP(i, n, th) {
      const float* b = nullptr;
      if (bias) b = bias + expert_of_row(offsets, experts, i / width) * width + i % width;
      kernels::bias_clamped_swiglu_row(h + i, h3 + i, b, alpha, limit, a + i, 1);
    }
  }
};

// Its backward (kernels::clamped_swiglu_backward_row). dh may alias da.
struct ClampedSwigluBackward {
  MOE_HD static void run(Thread th, const float* da, const float* h, const float* h3, float alpha,
                         float limit, float* dh, float* dh3, int64_t n) {
    MOE_GRID_LOOP(i, n, th) {
      kernels::clamped_swiglu_backward_row(h + i, h3 + i, da + i, alpha, limit, dh + i, dh3 + i, 1);
    }
  }
};

}  // namespace moe::cuda::body
