// CUDA causal attention with grouped-query heads and optional sinks: the steps of attention.cuh,
// with the products on cublasSgemmStridedBatched and the row softmax (and its backward, and the
// sinks' gradient) as kernels.
#include <cmath>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/dense_ops.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/runtime.h"

namespace moe::cuda {

namespace {

// Row-major C is column-major C^T = op(B)^T op(A)^T, so B goes first (as in cuda::gemm).
struct CublasBatched {
  cublasHandle_t handle;
  void operator()(const BatchedGemm& g) const {
    MOE_CUBLAS_CHECK(cublasSgemmStridedBatched(
        handle, g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
        g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(g.n), static_cast<int>(g.m),
        static_cast<int>(g.k), &g.alpha, g.b, static_cast<int>(g.ldb), g.stride_b, g.a,
        static_cast<int>(g.lda), g.stride_a, &g.beta, g.c, static_cast<int>(g.ldc), g.stride_c,
        static_cast<int>(g.batch)));
  }
};

// sinks [heads] on the device, or null (none).
struct SoftmaxLaunch {
  cudaStream_t stream;
  const float* sinks = nullptr;
  int64_t heads = 1;
  void operator()(float* scores, int64_t rows, int64_t queries, int64_t keys, int64_t start,
                  int64_t window) const {
    if (sinks) {
      launch<body::CausalSoftmaxSinkRows>(launch_shape(rows), stream, scores, rows, queries, keys,
                                          start, window, sinks, heads);
      return;
    }
    launch<body::CausalSoftmaxRows>(launch_shape(rows), stream, scores, rows, queries, keys, start,
                                    window);
  }
};

// With dsinks (then terms: scratch of one float a row, rows [batch, heads, seq]): each row's sink
// term before the row's backward replaces dscores, and their per-head sums after it.
struct SoftmaxBackwardLaunch {
  cudaStream_t stream;
  float* dsinks = nullptr;
  float* terms = nullptr;
  int64_t batch = 0, heads = 1;
  void operator()(const float* probs, float* dscores, int64_t rows, int64_t seq,
                  float scale) const {
    if (dsinks)
      launch<body::SinkGradientRows>(launch_shape(rows), stream, probs,
                                     static_cast<const float*>(dscores), terms, rows, seq);
    launch<body::CausalSoftmaxBackwardRows>(launch_shape(rows), stream, probs, dscores, rows, seq,
                                            scale);
    if (dsinks)
      launch<body::SinkGradientSum>(launch_shape(heads), stream, static_cast<const float*>(terms),
                                    batch, heads, seq, dsinks);
  }
};

const float* sinks_of(const Tensor& sinks) {
  return sinks.defined() ? sinks.data<float>() : nullptr;
}

float scale_of(int64_t head_dim) { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                       const ops::AttentionShape& s, const Tensor& sinks, Tensor& probs,
                       Tensor& ctx) {
  if (s.batch == 0 || s.seq == 0) return;
  const int device = ctx.device().index;
  use_device(device);
  cudaStream_t stream = current_stream(device);
  attention_forward_steps(q.data<float>(), k.data<float>(), v.data<float>(), probs.data<float>(),
                          ctx.data<float>(), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim,
                          scale_of(s.head_dim), s.window,
                          CublasBatched{cublas_handle(device, stream)},
                          SoftmaxLaunch{stream, sinks_of(sinks), s.heads});
}

void attention_backward(const Tensor& dctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& probs, const ops::AttentionShape& s, const Tensor& /*sinks*/,
                        Tensor& dq, Tensor& dk, Tensor& dv, Tensor* dsinks) {
  if (s.batch == 0 || s.seq == 0) return;
  const int device = dq.device().index;
  use_device(device);
  cudaStream_t stream = current_stream(device);
  Tensor dscores = Tensor::empty({s.batch, s.heads, s.seq, s.seq}, DType::f32, dq.device());
  Tensor terms;  // the sinks' per-row terms
  if (dsinks) terms = Tensor::empty({s.batch * s.heads * s.seq}, DType::f32, dq.device());
  attention_backward_steps(
      dctx.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(), probs.data<float>(),
      dscores.data<float>(), dq.data<float>(), dk.data<float>(), dv.data<float>(), s.batch, s.seq,
      s.heads, s.kv_heads, s.head_dim, scale_of(s.head_dim),
      CublasBatched{cublas_handle(device, stream)},
      SoftmaxBackwardLaunch{stream, dsinks ? dsinks->data<float>() : nullptr,
                            dsinks ? terms.data<float>() : nullptr, s.batch, s.heads});
}

void attention_forward_cached(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              int64_t heads, int64_t kv_heads, const ops::CachedRows& rows,
                              const Tensor& sinks, Tensor& ctx) {
  const int64_t R = rows.rows();
  if (R == 0) return;
  const int64_t hd = q.dim(1) / heads;
  int64_t largest = 0;  // the largest row's scores per head, count * keys
  for (int64_t r = 0; r < R; ++r) {
    const int64_t size = rows.count[r] * (rows.start[r] + rows.count[r]);
    largest = size > largest ? size : largest;
  }
  const int device = ctx.device().index;
  use_device(device);
  cudaStream_t stream = current_stream(device);
  Tensor scores = Tensor::empty({heads * largest}, DType::f32, ctx.device());
  attention_cached_steps(
      q.data<float>(), k_cache.data<float>(), v_cache.data<float>(), ctx.data<float>(),
      scores.data<float>(), rows.slot.data(), rows.start.data(), rows.count.data(), R, heads,
      kv_heads, hd, k_cache.dim(1), scale_of(hd), rows.window,
      CublasBatched{cublas_handle(device, stream)}, SoftmaxLaunch{stream, sinks_of(sinks), heads});
}

}  // namespace moe::cuda
