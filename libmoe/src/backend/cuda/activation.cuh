// Kernel bodies of bias add / bias gradient and the GELU / SwiGLU activations (grid.h): one thread
// per element (kernels/activations.h), one thread per column over rows in order for bias_grad.
// Shapes: y, dy [N, C]; bias [C]; activations elementwise over n values.
#pragma once
#include "backend/cuda/grid.h"
#include "kernels/activations.h"

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

}  // namespace moe::cuda::body
