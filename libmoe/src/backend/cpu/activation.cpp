// CPU loops of the elementwise ops of the dense layers: bias add / bias gradient (Linear) and the
// GELU / SwiGLU activations (MLP), looping over the kernel bodies of kernels/activations.h. Shapes:
// y, dy [N, C]; bias [C]; activations elementwise on any shape.
#include <algorithm>

#include "backend/cpu/backend.h"
#include "backend/cpu/vector_math.h"
#include "core/parallel.h"
#include "kernels/activations.h"

namespace moe::cpu {

namespace {
constexpr int64_t kColumnBlock = 64;

}  // namespace

void bias_add(Tensor& y, const Tensor& bias) {
  const int64_t n = y.dim(0), c = y.dim(1);
  float* ys = y.data<float>();
  const float* b = bias.data<float>();
#pragma omp parallel for schedule(static) if (n * c >= kParallelWork)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j) ys[i * c + j] += b[j];
}

void bias_grad(const Tensor& dy, Tensor& dbias) {
  const int64_t n = dy.dim(0), c = dy.dim(1);
  const float* g = dy.data<float>();
  float* db = dbias.data<float>();
  const int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (n * c >= kParallelWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kColumnBlock, j1 = std::min(c, j0 + kColumnBlock);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = j0; j < j1; ++j) db[j] += g[i * c + j];
  }
}

void gelu_forward(const Tensor& x, Tensor& y) {
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) ys[i] = kernels::gelu_tanh(xs[i]);
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const float* g = dy.data<float>();
  const float* xs = x.data<float>();
  float* dxs = dx.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) dxs[i] = g[i] * kernels::gelu_tanh_grad(xs[i]);
}

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y) {
  const float* gs = gate.data<float>();
  const float* us = up.data<float>();
  float* ys = y.data<float>();
  const int64_t n = gate.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) ys[i] = kernels::silu(gs[i]) * us[i];
}

void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup) {
  const float* g = dy.data<float>();
  const float* gs = gate.data<float>();
  const float* us = up.data<float>();
  float* dg = dgate.data<float>();
  float* du = dup.data<float>();
  const int64_t n = gate.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i], gate_i = gs[i], up_i = us[i];  // read before writing: outputs may alias
    dg[i] = gi * up_i * kernels::silu_grad(gate_i);
    du[i] = gi * kernels::silu(gate_i);
  }
}

}  // namespace moe::cpu
