// CUDA LayerNorm / RMSNorm forward and backward (bodies in norm.cuh).
#include "backend/cuda/dense_ops.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/runtime.h"

namespace moe::cuda {

namespace {

float* data_or_null(Tensor* t) { return t ? t->data<float>() : nullptr; }

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       Tensor& y, Tensor* mean, Tensor* rstd) {
  const int64_t n = x.dim(0), d = x.dim(1);
  if (n == 0) return;
  launch<body::LayerNormRows>(launch_shape(n), stream_of(y), x.data<float>(), weight.data<float>(),
                              bias.data<float>(), y.data<float>(), data_or_null(mean),
                              data_or_null(rstd), n, d, eps);
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor* dbias) {
  const int64_t n = x.dim(0), d = x.dim(1);
  if (n == 0 || d == 0) return;
  cudaStream_t stream = stream_of(dx);
  launch<body::LayerNormRowsBackward>(launch_shape(n), stream, dy.data<float>(), x.data<float>(),
                                      weight.data<float>(), mean.data<float>(), rstd.data<float>(),
                                      dx.data<float>(), n, d);
  launch<body::NormParamGrad>(launch_shape(d), stream, dy.data<float>(), x.data<float>(),
                              mean.data<float>(), rstd.data<float>(), dweight.data<float>(),
                              data_or_null(dbias), n, d);
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor* rstd) {
  const int64_t n = x.dim(0), d = x.dim(1);
  if (n == 0) return;
  launch<body::RmsNormRows>(launch_shape(n), stream_of(y), x.data<float>(), weight.data<float>(),
                            y.data<float>(), data_or_null(rstd), n, d, eps);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      Tensor& dx, Tensor& dweight) {
  const int64_t n = x.dim(0), d = x.dim(1);
  if (n == 0 || d == 0) return;
  cudaStream_t stream = stream_of(dx);
  launch<body::RmsNormRowsBackward>(launch_shape(n), stream, dy.data<float>(), x.data<float>(),
                                    weight.data<float>(), rstd.data<float>(), dx.data<float>(), n,
                                    d);
  const float* no_mean = nullptr;
  float* no_bias = nullptr;
  launch<body::NormParamGrad>(launch_shape(d), stream, dy.data<float>(), x.data<float>(), no_mean,
                              rstd.data<float>(), dweight.data<float>(), no_bias, n, d);
}

}  // namespace moe::cuda
