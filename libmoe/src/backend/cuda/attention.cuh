// Kernel bodies of causal attention (grid.h, kernels/attention.h): the row softmax of the scores
// (with or without attention sinks) and its backward, one thread per score row, and the sinks'
// gradient. The products around them are cuBLAS GEMMs
// (attention.cu).
#pragma once
#include "backend/cuda/grid.h"
#include "kernels/attention.h"

namespace moe::cuda::body {

// scores: `rows` rows of `keys` values, in blocks of `queries` rows; row r is query i = r % queries
// at position start + i, which sees keys 0 .. start + i (the last `window` of them with a sliding
// window, kernels::window_first_key; 0 = all). Softmax in place over the visible keys, exact zeros
// elsewhere.
struct CausalSoftmaxRows {
  MOE_HD static void run(Thread th, float* scores, int64_t rows, int64_t queries, int64_t keys,
                         int64_t start, int64_t window) {
    MOE_GRID_LOOP(r, rows, th) {
      const int64_t position = start + r % queries;
      kernels::mask_before_window(scores + r * keys, kernels::window_first_key(position, window));
      kernels::causal_softmax_row(scores + r * keys, position + 1, keys);
    }
  }
};

// CausalSoftmaxRows with attention sinks (gpt-oss): row r belongs to head (r / queries) % heads
// (the rows are [.., heads, queries]: [B, H, T] in the forward, [H, t] a cached row) and takes
// sinks[head] into its maximum and denominator (kernels::causal_softmax_sink_row).
struct CausalSoftmaxSinkRows {
  MOE_HD static void run(Thread th, float* scores, int64_t rows, int64_t queries, int64_t keys,
                         int64_t start, int64_t window, const float* sinks, int64_t heads) {
    MOE_GRID_LOOP(r, rows, th) {
      const int64_t position = start + r % queries;
      kernels::mask_before_window(scores + r * keys, kernels::window_first_key(position, window));
      kernels::causal_softmax_sink_row(scores + r * keys, position + 1, keys,
                                       sinks[(r / queries) % heads]);
    }
  }
};

// The sinks' backward, before CausalSoftmaxBackwardRows replaces dscores (which holds dctx V^T):
// terms[r] = kernels::sink_gradient_row of row r (query r % seq), rows [B, H, T].
struct SinkGradientRows {
  MOE_HD static void run(Thread th, const float* probs, const float* dscores, float* terms,
                         int64_t rows, int64_t seq) {
    MOE_GRID_LOOP(r, rows, th) {
      terms[r] = kernels::sink_gradient_row(probs + r * seq, dscores + r * seq, r % seq + 1);
    }
  }
};

// dsinks[h] += the sum of head h's terms (kernels::sink_gradient_sum), one thread a head.
struct SinkGradientSum {
  MOE_HD static void run(Thread th, const float* terms, int64_t batch, int64_t heads, int64_t seq,
                         float* dsinks) {
    MOE_GRID_LOOP(h, heads, th) { kernels::sink_gradient_sum(terms, batch, heads, seq, h, dsinks); }
  }
};

// probs, dscores [rows, seq] in blocks of seq rows (row r is query r % seq): dscores holds
// dctx V^T and is replaced by scale * softmax_backward(probs, dscores) on the visible keys, zero
// after them.
struct CausalSoftmaxBackwardRows {
  MOE_HD static void run(Thread th, const float* probs, float* dscores, int64_t rows, int64_t seq,
                         float scale) {
    MOE_GRID_LOOP(r, rows, th) {
      kernels::causal_softmax_backward_row(probs + r * seq, dscores + r * seq, r % seq + 1, seq,
                                           scale);
    }
  }
};

}  // namespace moe::cuda::body

namespace moe::cuda {

// Host code: the sequence of products and row kernels of each attention op, with the products
// handed to `gemm` (a BatchedGemm) and the row kernels to `softmax` / `softmax_backward`. The
// CUDA ops pass cuBLAS and kernel launches; the harness tests pass CPU GEMMs and run_grid_on_cpu,
// so the offsets and strides below are checked against the CPU backend.

// Row-major C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch, X_i = x + i * stride_x; ld* are
// the row-major leading dimensions.
struct BatchedGemm {
  bool transpose_a, transpose_b;
  int64_t m, n, k;
  float alpha;
  const float* a;
  int64_t lda, stride_a;
  const float* b;
  int64_t ldb, stride_b;
  float beta;
  float* c;
  int64_t ldc, stride_c, batch;
};

// One product per query head h, batched over the B sequences (sequence b of head h is H*T*T
// floats after sequence b - 1 in probs); query head h reads kv head h / (H / KV).
// softmax(scores, rows, queries, keys, start, window) as body::CausalSoftmaxRows.
template <class Gemm, class Softmax>
void attention_forward_steps(const float* q, const float* k, const float* v, float* probs,
                             float* ctx, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                             float scale, int64_t window, Gemm gemm, Softmax softmax) {
  const int64_t group = H / KV, ldq = H * hd, ldk = KV * hd, TT = T * T;
  for (int64_t h = 0; h < H; ++h)
    gemm(BatchedGemm{false, true, T, T, hd, scale, q + h * hd, ldq, T * ldq, k + (h / group) * hd,
                     ldk, T * ldk, 0.0f, probs + h * TT, T, H * TT, B});
  softmax(probs, B * H * T, T, T, int64_t{0}, window);
  for (int64_t h = 0; h < H; ++h)
    gemm(BatchedGemm{false, false, T, hd, T, 1.0f, probs + h * TT, T, H * TT, v + (h / group) * hd,
                     ldk, T * ldk, 0.0f, ctx + h * hd, ldq, T * ldq, B});
}

// dscores [B, H, T, T] is scratch. The kv gradients accumulate over query heads in head order
// (beta 0 for a group's first head, 1 after), as on the CPU.
// softmax_backward(probs, dscores, rows, seq, scale) as body::CausalSoftmaxBackwardRows.
template <class Gemm, class SoftmaxBackward>
void attention_backward_steps(const float* dctx, const float* q, const float* k, const float* v,
                              const float* probs, float* dscores, float* dq, float* dk, float* dv,
                              int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, float scale,
                              Gemm gemm, SoftmaxBackward softmax_backward) {
  const int64_t group = H / KV, ldq = H * hd, ldk = KV * hd, TT = T * T;
  for (int64_t h = 0; h < H; ++h)
    gemm(BatchedGemm{false, true, T, T, hd, 1.0f, dctx + h * hd, ldq, T * ldq, v + (h / group) * hd,
                     ldk, T * ldk, 0.0f, dscores + h * TT, T, H * TT, B});
  softmax_backward(probs, dscores, B * H * T, T, scale);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t kv = (h / group) * hd, qh = h * hd;
    const float beta = h % group == 0 ? 0.0f : 1.0f;
    gemm(BatchedGemm{false, false, T, hd, T, 1.0f, dscores + h * TT, T, H * TT, k + kv, ldk,
                     T * ldk, 0.0f, dq + qh, ldq, T * ldq, B});
    gemm(BatchedGemm{true, false, T, hd, T, 1.0f, dscores + h * TT, T, H * TT, q + qh, ldq, T * ldq,
                     beta, dk + kv, ldk, T * ldk, B});
    gemm(BatchedGemm{true, false, T, hd, T, 1.0f, probs + h * TT, T, H * TT, dctx + qh, ldq,
                     T * ldq, beta, dv + kv, ldk, T * ldk, B});
  }
}

// Cached attention over R rows (ops::CachedRows as arrays): per row, one product per kv head
// batched over its `group` query heads (hd apart in q/ctx, the kv operand shared: stride 0).
// scores is scratch of H * max over rows of count * (start + count) floats; window as
// ops::CachedRows::window.
template <class Gemm, class Softmax>
void attention_cached_steps(const float* q, const float* k_cache, const float* v_cache, float* ctx,
                            float* scores, const int64_t* slot, const int64_t* start,
                            const int64_t* count, int64_t R, int64_t H, int64_t KV, int64_t hd,
                            int64_t capacity, float scale, int64_t window, Gemm gemm,
                            Softmax softmax) {
  const int64_t group = H / KV, ldq = H * hd, ldk = KV * hd;
  int64_t first = 0;  // the row's first token in q/ctx
  for (int64_t r = 0; r < R; ++r) {
    const int64_t t = count[r], keys = start[r] + t, kv_base = slot[r] * capacity * ldk;
    for (int64_t g = 0; g < KV; ++g)
      gemm(BatchedGemm{false, true, t, keys, hd, scale, q + first * ldq + g * group * hd, ldq, hd,
                       k_cache + kv_base + g * hd, ldk, 0, 0.0f, scores + g * group * t * keys,
                       keys, t * keys, group});
    softmax(scores, H * t, t, keys, start[r], window);
    for (int64_t g = 0; g < KV; ++g)
      gemm(BatchedGemm{false, false, t, hd, keys, 1.0f, scores + g * group * t * keys, keys,
                       t * keys, v_cache + kv_base + g * hd, ldk, 0, 0.0f,
                       ctx + first * ldq + g * group * hd, ldq, hd, group});
    first += t;
  }
}

}  // namespace moe::cuda
