// CUDA bias add / bias gradient and GELU / SwiGLU (bodies in activation.cuh).
#include "backend/cuda/activation.cuh"
#include "backend/cuda/dense_ops.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/runtime.h"

namespace moe::cuda {

void bias_add(Tensor& y, const Tensor& bias) {
  const int64_t n = y.dim(0), c = y.dim(1);
  if (n * c == 0) return;
  launch<body::BiasAdd>(launch_shape(n * c), stream_of(y), y.data<float>(), bias.data<float>(), n,
                        c);
}

void bias_grad(const Tensor& dy, Tensor& dbias) {
  const int64_t n = dy.dim(0), c = dy.dim(1);
  if (n == 0 || c == 0) return;
  launch<body::BiasGrad>(launch_shape(c), stream_of(dbias), dy.data<float>(), dbias.data<float>(),
                         n, c);
}

void gelu_forward(const Tensor& x, Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  launch<body::Gelu>(launch_shape(n), stream_of(y), x.data<float>(), y.data<float>(), n);
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const int64_t n = x.numel();
  if (n == 0) return;
  launch<body::GeluBackward>(launch_shape(n), stream_of(dx), dy.data<float>(), x.data<float>(),
                             dx.data<float>(), n);
}

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  launch<body::Swiglu>(launch_shape(n), stream_of(y), gate.data<float>(), up.data<float>(),
                       y.data<float>(), n);
}

void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  launch<body::SwigluBackward>(launch_shape(n), stream_of(dgate), dy.data<float>(),
                               gate.data<float>(), up.data<float>(), dgate.data<float>(),
                               dup.data<float>(), n);
}

}  // namespace moe::cuda
