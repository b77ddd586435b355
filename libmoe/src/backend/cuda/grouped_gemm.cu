// CUDA grouped expert GEMM (one cublasSgemm per non-empty segment on the current stream; the
// offsets are host vectors) and the experts' bias / activation kernels (offsets uploaded once
// per call). cuBLAS is deterministic for a fixed shape, so no K split is needed.
//
// Each segment's result depends on that segment alone: its cublasSgemm sees only the segment's
// m, n, k, leading dimensions (functions of the weight's shape) and beta, and the bias and
// activation kernels work per element or per (expert, column) over the segment's rows. So one
// expert run as a group of one (offsets {0, rows}: the tiered store, nn/experts.cpp) gives the
// whole-layer call's bits, provided cuBLAS picks the same kernel for both weight pointers: the
// store's slot sections are 64-byte aligned, a resident expert's slice at least 16-byte aligned
// when its F x D (or D x F) elements are a multiple of 4 (tests/cuda/test_cuda_offload.cpp).
#include "backend/cuda/grouped_gemm.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_ops.h"
#include "backend/cuda/runtime.h"

namespace moe::cuda {

namespace {

// Leading dimensions must be >= 1 even for an empty K.
int ld(int64_t n) { return static_cast<int>(n > 1 ? n : 1); }

Tensor upload_offsets(const std::vector<int32_t>& offsets, Device device) {
  return Tensor::from_vector({static_cast<int64_t>(offsets.size())}, offsets).to(device);
}

}  // namespace

void grouped_gemm(const Tensor& a, const Tensor& w, bool transpose_w,
                  const std::vector<int32_t>& offsets, Tensor& c, float beta) {
  const int64_t experts = w.dim(0), r = w.dim(1), s = w.dim(2);
  const int64_t k = transpose_w ? s : r, n = transpose_w ? r : s;
  if (n == 0) return;
  const int device = c.device().index;
  cudaStream_t stream = stream_of(c);
  cublasHandle_t handle = cublas_handle(device, stream);
  const float alpha = 1.0f;
  const float* as = a.data<float>();
  const float* ws = w.data<float>();
  float* cs = c.data<float>();
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = offsets[e], m = offsets[e + 1] - begin;
    if (m == 0) continue;
    // Row-major C[m,n] = A[m,k] op(W) is column-major C^T = op(W)^T A^T: W first (ld S), then A.
    MOE_CUBLAS_CHECK(cublasSgemm(handle, transpose_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N,
                                 static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                                 &alpha, ws + e * r * s, ld(s), as + begin * k, ld(k), &beta,
                                 cs + begin * n, ld(n)));
  }
}

void grouped_gemm_weight_grad(const Tensor& dy, const Tensor& x,
                              const std::vector<int32_t>& offsets, Tensor& dw) {
  const int64_t experts = dw.dim(0), r = dw.dim(1), s = dw.dim(2);
  if (r == 0 || s == 0) return;
  const int device = dw.device().index;
  cudaStream_t stream = stream_of(dw);
  cublasHandle_t handle = cublas_handle(device, stream);
  const float alpha = 1.0f, beta = 1.0f;
  const float* dys = dy.data<float>();
  const float* xs = x.data<float>();
  float* dws = dw.data<float>();
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = offsets[e], m = offsets[e + 1] - begin;
    if (m == 0) continue;
    // Row-major dW[r,s] += dY_seg^T X_seg is column-major dW^T = X_seg^T dY_seg (X^T read as-is).
    MOE_CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(s),
                                 static_cast<int>(r), static_cast<int>(m), &alpha, xs + begin * s,
                                 static_cast<int>(s), dys + begin * r, static_cast<int>(r), &beta,
                                 dws + e * r * s, static_cast<int>(s)));
  }
}

void expert_activation(Tensor& h, const Tensor& h3, const Tensor& bias,
                       const std::vector<int32_t>& offsets, Activation activation, Tensor& a) {
  const int64_t n = h.numel();
  if (n == 0) return;
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1;
  const Tensor offs = upload_offsets(offsets, h.device());
  const float* h3s = activation == Activation::swiglu ? h3.data<float>() : nullptr;
  launch<body::ExpertActivation>(launch_shape(n), stream_of(h), h.data<float>(), h3s,
                                 bias.defined() ? bias.data<float>() : nullptr,
                                 offs.data<int32_t>(), experts, h.dim(1), a.data<float>(), n);
}

void expert_activation_backward(const Tensor& da, const Tensor& h, const Tensor& h3,
                                Activation activation, Tensor& dh, Tensor& dh3) {
  const int64_t n = da.numel();
  if (n == 0) return;
  const bool swiglu = activation == Activation::swiglu;
  launch<body::ExpertActivationBackward>(launch_shape(n), stream_of(da), da.data<float>(),
                                         h.data<float>(), swiglu ? h3.data<float>() : nullptr,
                                         dh.data<float>(), swiglu ? dh3.data<float>() : nullptr, n);
}

void grouped_add_bias(Tensor& y, const Tensor& bias, const std::vector<int32_t>& offsets) {
  const int64_t n = y.numel();
  if (n == 0) return;
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1;
  const Tensor offs = upload_offsets(offsets, y.device());
  launch<body::GroupedAddBias>(launch_shape(n), stream_of(y), y.data<float>(), bias.data<float>(),
                               offs.data<int32_t>(), experts, y.dim(1), n);
}

void grouped_bias_grad(const Tensor& dy, const std::vector<int32_t>& offsets, Tensor& dbias) {
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1, width = dy.dim(1);
  if (experts * width == 0) return;
  const Tensor offs = upload_offsets(offsets, dy.device());
  launch<body::GroupedBiasGrad>(launch_shape(experts * width), stream_of(dy), dy.data<float>(),
                                offs.data<int32_t>(), experts, width, dbias.data<float>());
}

}  // namespace moe::cuda
