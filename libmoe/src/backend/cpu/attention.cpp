// Causal scaled-dot-product attention with grouped-query heads, forward and backward.
// Shapes: q, ctx [B*T, H*hd]; k, v [B*T, KV*hd]; probs [B, H, T, T]; query head h reads kv head
// h / (H/KV). Per (batch, head) products go to BLAS (cpu::sgemm, called from serial loops:
// OpenBLAS threads inside each call and splits only output rows/columns, never the reduction);
// the causal row softmax and its backward (kernels/attention.h, shared with CUDA) run in one
// OpenMP loop over all B*H*T rows.
// Scores above the diagonal are computed by the GEMM and then overwritten with exact zeros.
#include "kernels/attention.h"

#include <cmath>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/parallel.h"
#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#ifdef MOE_HAVE_CUDA
#include "backend/cuda/dense_ops.h"
#endif

namespace moe::ops {

namespace {
// Loops over fewer elements than this run on the calling thread: a fork/join costs more.

void check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                     const AttentionShape& s) {
  MOE_CHECK(s.batch >= 0 && s.seq >= 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0 &&
                s.heads % s.kv_heads == 0,
            op, ": bad shape: batch ", s.batch, ", seq ", s.seq, ", heads ", s.heads, ", kv_heads ",
            s.kv_heads, ", head_dim ", s.head_dim);
  const int64_t n = s.batch * s.seq;
  q.expect_shape({n, s.heads * s.head_dim}, op);
  k.expect_shape({n, s.kv_heads * s.head_dim}, op);
  v.expect_shape({n, s.kv_heads * s.head_dim}, op);
  q.expect_dtype(DType::f32, op);
  k.expect_dtype(DType::f32, op);
  v.expect_dtype(DType::f32, op);
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionShape& s,
                       Tensor& probs, Tensor& ctx) {
  [[maybe_unused]] const Device device =
      require_backend("attention_forward", {&q, &k, &v, &probs, &ctx});
  check_attention("attention_forward", q, k, v, s);
  probs.expect_shape({s.batch, s.heads, s.seq, s.seq}, "attention_forward probs");
  probs.expect_dtype(DType::f32, "attention_forward probs");
  ctx.expect_shape(q.shape(), "attention_forward context");
  ctx.expect_dtype(DType::f32, "attention_forward context");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::attention_forward(q, k, v, s, probs, ctx);
#endif
  const int64_t T = s.seq, hd = s.head_dim, H = s.heads, KV = s.kv_heads, group = H / KV;
  const int64_t ldq = H * hd, ldk = KV * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* qs = q.data<float>();
  const float* ks = k.data<float>();
  const float* vs = v.data<float>();
  float* ps = probs.data<float>();
  float* cs = ctx.data<float>();

  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      cpu::sgemm(false, true, T, T, hd, scale, qs + b * T * ldq + h * hd, ldq,
                 ks + b * T * ldk + (h / group) * hd, ldk, 0.0f, ps + (b * H + h) * T * T, T);
  const int64_t rows = s.batch * H * T;
#pragma omp parallel for schedule(static) if (rows * T >= cpu::kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    kernels::causal_softmax_row(ps + r * T, r % T + 1, T);  // query r % T sees keys 0..r % T
  }
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      cpu::sgemm(false, false, T, hd, T, 1.0f, ps + (b * H + h) * T * T, T,
                 vs + b * T * ldk + (h / group) * hd, ldk, 0.0f, cs + b * T * ldq + h * hd, ldq);
}

int64_t CachedRows::tokens() const {
  int64_t n = 0;
  for (int64_t c : count) n += c;
  return n;
}

void CachedRows::check(int64_t slots, int64_t capacity, const char* what) const {
  const size_t r = count.size();
  MOE_CHECK(slot.size() == r && start.size() == r, what, ": ", r, " counts, ", slot.size(),
            " slots and ", start.size(), " starts");
  std::vector<bool> used(static_cast<size_t>(slots > 0 ? slots : 0), false);
  for (size_t i = 0; i < r; ++i) {
    MOE_CHECK(count[i] >= 1 && start[i] >= 0 && slot[i] >= 0 && slot[i] < slots, what, ": row ", i,
              " has count ", count[i], ", start ", start[i], ", slot ", slot[i], " (of ", slots,
              ")");
    MOE_CHECK(!used[static_cast<size_t>(slot[i])], what, ": slot ", slot[i], " appears twice");
    used[static_cast<size_t>(slot[i])] = true;
    MOE_CHECK(start[i] + count[i] <= capacity, what, ": row ", i, " reaches position ",
              start[i] + count[i], ", beyond the cache's ", capacity);
  }
}

void attention_forward_cached(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              int64_t heads, int64_t kv_heads, const CachedRows& rows,
                              Tensor& ctx) {
  const char* op = "attention_forward_cached";
  [[maybe_unused]] const Device device = require_backend(op, {&q, &k_cache, &v_cache, &ctx});
  MOE_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && k_cache.ndim() == 3 &&
                q.ndim() == 2 && q.dim(1) % heads == 0,
            op, ": bad shape: q ", q.describe(), ", k cache ", k_cache.describe(), ", heads ",
            heads, ", kv_heads ", kv_heads);
  const int64_t H = heads, KV = kv_heads, group = H / KV, hd = q.dim(1) / H;
  const int64_t slots = k_cache.dim(0), capacity = k_cache.dim(1);
  const int64_t ldq = H * hd, ldk = KV * hd;
  rows.check(slots, capacity, op);
  q.expect_shape({rows.tokens(), ldq}, op);
  k_cache.expect_shape({slots, capacity, ldk}, "attention_forward_cached k cache");
  v_cache.expect_shape({slots, capacity, ldk}, "attention_forward_cached v cache");
  ctx.expect_shape(q.shape(), "attention_forward_cached context");
  for (const Tensor* t : {&q, &k_cache, &v_cache, static_cast<const Tensor*>(&ctx)})
    t->expect_dtype(DType::f32, op);
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda)
    return cuda::attention_forward_cached(q, k_cache, v_cache, heads, kv_heads, rows, ctx);
#endif
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* qs = q.data<float>();
  const float* ks = k_cache.data<float>();
  const float* vs = v_cache.data<float>();
  float* cs = ctx.data<float>();

  std::vector<float> scores;
  int64_t first = 0;  // the row's first token in q/ctx
  for (int64_t r = 0; r < rows.rows(); ++r) {
    const int64_t t = rows.count[r], start = rows.start[r], keys = start + t;
    const int64_t slot_offset = rows.slot[r] * capacity * ldk;
    scores.resize(static_cast<size_t>(t * keys));
    float* ps = scores.data();
    for (int64_t h = 0; h < H; ++h) {
      const int64_t q_offset = first * ldq + h * hd, kv_offset = slot_offset + (h / group) * hd;
      cpu::sgemm(false, true, t, keys, hd, scale, qs + q_offset, ldq, ks + kv_offset, ldk, 0.0f, ps,
                 keys);
      for (int64_t i = 0; i < t; ++i)  // query i sits at start + i: keys 0..start+i visible
        kernels::causal_softmax_row(ps + i * keys, start + i + 1, keys);
      cpu::sgemm(false, false, t, hd, keys, 1.0f, ps, keys, vs + kv_offset, ldk, 0.0f,
                 cs + q_offset, ldq);
    }
    first += t;
  }
}

void attention_backward(const Tensor& dctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& probs, const AttentionShape& s, Tensor& dq, Tensor& dk,
                        Tensor& dv) {
  [[maybe_unused]] const Device device =
      require_backend("attention_backward", {&dctx, &q, &k, &v, &probs, &dq, &dk, &dv});
  check_attention("attention_backward", q, k, v, s);
  dctx.expect_shape(q.shape(), "attention_backward dctx");
  dctx.expect_dtype(DType::f32, "attention_backward dctx");
  probs.expect_shape({s.batch, s.heads, s.seq, s.seq}, "attention_backward probs");
  probs.expect_dtype(DType::f32, "attention_backward probs");
  dq.expect_shape(q.shape(), "attention_backward dq");
  dk.expect_shape(k.shape(), "attention_backward dk");
  dv.expect_shape(v.shape(), "attention_backward dv");
  dq.expect_dtype(DType::f32, "attention_backward dq");
  dk.expect_dtype(DType::f32, "attention_backward dk");
  dv.expect_dtype(DType::f32, "attention_backward dv");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda)
    return cuda::attention_backward(dctx, q, k, v, probs, s, dq, dk, dv);
#endif
  const int64_t T = s.seq, hd = s.head_dim, H = s.heads, KV = s.kv_heads, group = H / KV;
  const int64_t ldq = H * hd, ldk = KV * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* gs = dctx.data<float>();
  const float* qs = q.data<float>();
  const float* ks = k.data<float>();
  const float* vs = v.data<float>();
  const float* ps = probs.data<float>();
  float* dqs = dq.data<float>();
  float* dks = dk.data<float>();
  float* dvs = dv.data<float>();

  // dS = scale * softmax_backward(P, dctx V^T), causal part only.
  Tensor dscores = Tensor::empty({s.batch, H, T, T});
  float* ds = dscores.data<float>();
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      cpu::sgemm(false, true, T, T, hd, 1.0f, gs + b * T * ldq + h * hd, ldq,
                 vs + b * T * ldk + (h / group) * hd, ldk, 0.0f, ds + (b * H + h) * T * T, T);
  const int64_t rows = s.batch * H * T;
#pragma omp parallel for schedule(static) if (rows * T >= cpu::kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    kernels::causal_softmax_backward_row(ps + r * T, ds + r * T, r % T + 1, T, scale);
  }
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const float* dsh = ds + (b * H + h) * T * T;
      const float* ph = ps + (b * H + h) * T * T;
      const int64_t kv_offset = b * T * ldk + (h / group) * hd;
      const int64_t q_offset = b * T * ldq + h * hd;
      // The first query head of a group writes its kv head's gradients, the others add, in order.
      const float beta = h % group == 0 ? 0.0f : 1.0f;
      cpu::sgemm(false, false, T, hd, T, 1.0f, dsh, T, ks + kv_offset, ldk, 0.0f, dqs + q_offset,
                 ldq);
      cpu::sgemm(true, false, T, hd, T, 1.0f, dsh, T, qs + q_offset, ldq, beta, dks + kv_offset,
                 ldk);
      cpu::sgemm(true, false, T, hd, T, 1.0f, ph, T, gs + q_offset, ldq, beta, dvs + kv_offset,
                 ldk);
    }
}

}  // namespace moe::ops
