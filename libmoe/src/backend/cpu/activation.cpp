// CPU loops of the elementwise ops of the dense layers: bias add / bias gradient (Linear) and the
// GELU / SwiGLU activations (MLP), the latter through the experts' activation spans
// (activation_rows.h) with an empty bias. Shapes: y, dy [N, C]; bias [C]; activations elementwise
// on any shape.
#include <algorithm>

#include "backend/cpu/activation_rows.h"
#include "backend/cpu/backend.h"
#include "core/parallel.h"

namespace moe::cpu {

namespace {
constexpr int64_t kColumnBlock = 64;

// The activations of a whole tensor: spans of kSpan floats (a multiple of the spans' block, so
// every element sits at the same place of a block whatever the thread count), OpenMP over spans.
constexpr int64_t kSpan = 64 * kActivationLanes;

template <class Fn>
void for_each_span(int64_t numel, const Fn& fn) {
  const int64_t spans = (numel + kSpan - 1) / kSpan;
#pragma omp parallel for schedule(static) if (numel >= kParallelWork)
  for (int64_t s = 0; s < spans; ++s) fn(s * kSpan, std::min(kSpan, numel - s * kSpan));
}

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
  for_each_span(x.numel(),
                [&](int64_t b, int64_t n) { bias_gelu_span(xs + b, nullptr, nullptr, ys + b, n); });
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const float* g = dy.data<float>();
  const float* xs = x.data<float>();
  float* dxs = dx.data<float>();
  for_each_span(x.numel(),
                [&](int64_t b, int64_t n) { gelu_backward_span(xs + b, g + b, dxs + b, n); });
}

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y) {
  const float* gs = gate.data<float>();
  const float* us = up.data<float>();
  float* ys = y.data<float>();
  for_each_span(gate.numel(), [&](int64_t b, int64_t n) {
    bias_swiglu_span(gs + b, us + b, nullptr, nullptr, ys + b, n);
  });
}

void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup) {
  const float* g = dy.data<float>();
  const float* gs = gate.data<float>();
  const float* us = up.data<float>();
  float* dg = dgate.data<float>();
  float* du = dup.data<float>();
  // The span reads a block's inputs before it writes its outputs: dgate / dup may alias them.
  for_each_span(gate.numel(), [&](int64_t b, int64_t n) {
    swiglu_backward_span(gs + b, us + b, g + b, dg + b, du + b, n);
  });
}

}  // namespace moe::cpu
