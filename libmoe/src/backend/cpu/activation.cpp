// Elementwise ops of the dense layers: bias add / bias gradient (Linear) and the GELU / SwiGLU
// activations (MLP), looping over the kernel bodies of kernels/activations.h.
// Shapes: y, dy [N, C]; bias [C]; activations elementwise on any shape.
#include <algorithm>

#include "backend/cpu/parallel.h"
#include "backend/cpu/vector_math.h"
#include "kernels/activations.h"
#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#ifdef MOE_HAVE_CUDA
#include "backend/cuda/dense_ops.h"
#endif

namespace moe::ops {

namespace {
// Loops over fewer elements than this run on the calling thread: a fork/join costs more.

constexpr int64_t kColumnBlock = 64;

void check_same(const Tensor& a, const Tensor& b, const char* what) {
  b.expect_shape(a.shape(), what);
  b.expect_dtype(DType::f32, what);
}

}  // namespace

void bias_add(Tensor& y, const Tensor& bias) {
  [[maybe_unused]] const Device device = require_backend("bias_add", {&y, &bias});
  MOE_CHECK(y.ndim() == 2, "bias_add: ", y.describe(), " is not 2-D [N,C]");
  y.expect_dtype(DType::f32, "bias_add output");
  const int64_t n = y.dim(0), c = y.dim(1);
  bias.expect_shape({c}, "bias_add bias");
  bias.expect_dtype(DType::f32, "bias_add bias");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::bias_add(y, bias);
#endif
  float* ys = y.data<float>();
  const float* b = bias.data<float>();
#pragma omp parallel for schedule(static) if (n * c >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j) ys[i * c + j] += b[j];
}

void bias_grad(const Tensor& dy, Tensor& dbias) {
  [[maybe_unused]] const Device device = require_backend("bias_grad", {&dy, &dbias});
  MOE_CHECK(dy.ndim() == 2, "bias_grad: ", dy.describe(), " is not 2-D [N,C]");
  dy.expect_dtype(DType::f32, "bias_grad dy");
  const int64_t n = dy.dim(0), c = dy.dim(1);
  dbias.expect_shape({c}, "bias_grad gradient");
  dbias.expect_dtype(DType::f32, "bias_grad gradient");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::bias_grad(dy, dbias);
#endif
  const float* g = dy.data<float>();
  float* db = dbias.data<float>();
  const int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (n * c >= cpu::kParallelWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kColumnBlock, j1 = std::min(c, j0 + kColumnBlock);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = j0; j < j1; ++j) db[j] += g[i * c + j];
  }
}

void gelu_forward(const Tensor& x, Tensor& y) {
  [[maybe_unused]] const Device device = require_backend("gelu_forward", {&x, &y});
  x.expect_dtype(DType::f32, "gelu_forward input");
  check_same(x, y, "gelu_forward output");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::gelu_forward(x, y);
#endif
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i) ys[i] = kernels::gelu_tanh(xs[i]);
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  [[maybe_unused]] const Device device = require_backend("gelu_backward", {&dy, &x, &dx});
  x.expect_dtype(DType::f32, "gelu_backward input");
  check_same(x, dy, "gelu_backward dy");
  check_same(x, dx, "gelu_backward dx");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::gelu_backward(dy, x, dx);
#endif
  const float* g = dy.data<float>();
  const float* xs = x.data<float>();
  float* dxs = dx.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i) dxs[i] = g[i] * kernels::gelu_tanh_grad(xs[i]);
}

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y) {
  [[maybe_unused]] const Device device = require_backend("swiglu_forward", {&gate, &up, &y});
  gate.expect_dtype(DType::f32, "swiglu_forward gate");
  check_same(gate, up, "swiglu_forward up");
  check_same(gate, y, "swiglu_forward output");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::swiglu_forward(gate, up, y);
#endif
  const float* gs = gate.data<float>();
  const float* us = up.data<float>();
  float* ys = y.data<float>();
  const int64_t n = gate.numel();
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i) ys[i] = kernels::silu(gs[i]) * us[i];
}

void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup) {
  [[maybe_unused]] const Device device =
      require_backend("swiglu_backward", {&dy, &gate, &up, &dgate, &dup});
  gate.expect_dtype(DType::f32, "swiglu_backward gate");
  check_same(gate, up, "swiglu_backward up");
  check_same(gate, dy, "swiglu_backward dy");
  check_same(gate, dgate, "swiglu_backward dgate");
  check_same(gate, dup, "swiglu_backward dup");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::swiglu_backward(dy, gate, up, dgate, dup);
#endif
  const float* g = dy.data<float>();
  const float* gs = gate.data<float>();
  const float* us = up.data<float>();
  float* dg = dgate.data<float>();
  float* du = dup.data<float>();
  const int64_t n = gate.numel();
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i], gate_i = gs[i], up_i = us[i];  // read before writing: outputs may alias
    dg[i] = gi * up_i * kernels::silu_grad(gate_i);
    du[i] = gi * kernels::silu(gate_i);
  }
}

}  // namespace moe::ops
