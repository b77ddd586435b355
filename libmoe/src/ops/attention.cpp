// Causal scaled-dot-product attention with grouped-query heads and optional sinks, forward,
// backward and cached: operand checks, then Backend::dense.
// Shapes: q, ctx [B*T, H*hd]; k, v [B*T, KV*hd]; probs [B, H, T, T].
#include <algorithm>

#include "core/backend.h"
#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#include "moe/step_breakdown.h"

namespace moe::ops {

namespace {

void check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                     const AttentionShape& s) {
  MOE_CHECK(s.batch >= 0 && s.seq >= 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0 &&
                s.heads % s.kv_heads == 0 && s.window >= 0,
            op, ": bad shape: batch ", s.batch, ", seq ", s.seq, ", heads ", s.heads, ", kv_heads ",
            s.kv_heads, ", head_dim ", s.head_dim, ", window ", s.window);
  const int64_t n = s.batch * s.seq;
  q.expect_shape({n, s.heads * s.head_dim}, op);
  k.expect_shape({n, s.kv_heads * s.head_dim}, op);
  v.expect_shape({n, s.kv_heads * s.head_dim}, op);
  q.expect_dtype(DType::f32, op);
  k.expect_dtype(DType::f32, op);
  v.expect_dtype(DType::f32, op);
}

// sinks: undefined (none) or [heads] f32, one sink logit a query head.
void check_sinks(const char* op, const Tensor& sinks, int64_t heads) {
  if (!sinks.defined()) return;
  MOE_CHECK(sinks.ndim() == 1 && sinks.dim(0) == heads, op, ": attention sinks ", sinks.describe(),
            " must hold one logit for each of the ", heads, " query heads");
  sinks.expect_dtype(DType::f32, op);
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionShape& s,
                       Tensor& probs, Tensor& ctx, const Tensor& sinks) {
  const PartScope part(StepPart::attention);
  const Device device = require_backend("attention_forward", {&q, &k, &v, &sinks, &probs, &ctx});
  check_attention("attention_forward", q, k, v, s);
  check_sinks("attention_forward", sinks, s.heads);
  probs.expect_shape({s.batch, s.heads, s.seq, s.seq}, "attention_forward probs");
  probs.expect_dtype(DType::f32, "attention_forward probs");
  ctx.expect_shape(q.shape(), "attention_forward context");
  ctx.expect_dtype(DType::f32, "attention_forward context");
  backend_for(device).dense.attention_forward(q, k, v, s, sinks, probs, ctx);
}

void attention_forward_cached(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              int64_t heads, int64_t kv_heads, const CachedRows& rows, Tensor& ctx,
                              const Tensor& sinks) {
  const PartScope part(StepPart::attention);
  const char* op = "attention_forward_cached";
  const Device device = require_backend(op, {&q, &k_cache, &v_cache, &sinks, &ctx});
  MOE_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && k_cache.ndim() == 3 &&
                q.ndim() == 2 && q.dim(1) % heads == 0,
            op, ": bad shape: q ", q.describe(), ", k cache ", k_cache.describe(), ", heads ",
            heads, ", kv_heads ", kv_heads);
  const int64_t H = heads, KV = kv_heads, hd = q.dim(1) / H;
  const int64_t slots = k_cache.dim(0), capacity = k_cache.dim(1);
  const int64_t ldq = H * hd, ldk = KV * hd;
  rows.check(slots, capacity, op);
  q.expect_shape({rows.tokens(), ldq}, op);
  k_cache.expect_shape({slots, capacity, ldk}, "attention_forward_cached k cache");
  v_cache.expect_shape({slots, capacity, ldk}, "attention_forward_cached v cache");
  ctx.expect_shape(q.shape(), "attention_forward_cached context");
  for (const Tensor* t : {&q, &k_cache, &v_cache, static_cast<const Tensor*>(&ctx)})
    t->expect_dtype(DType::f32, op);
  check_sinks(op, sinks, heads);
  backend_for(device).dense.attention_forward_cached(q, k_cache, v_cache, heads, kv_heads, rows,
                                                     sinks, ctx);
}

void attention_forward_blocks(const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttentionShape& s, int64_t block_rows, Tensor& ctx,
                              const Tensor& sinks) {
  check_attention("attention_forward_blocks", q, k, v, s);
  MOE_CHECK(block_rows > 0, "attention_forward_blocks: ", block_rows, " query rows a block");
  ctx.expect_shape(q.shape(), "attention_forward_blocks context");
  ctx.expect_dtype(DType::f32, "attention_forward_blocks context");
  const int64_t B = s.batch, T = s.seq, ldk = s.kv_heads * s.head_dim;
  if (B == 0 || T == 0) return;
  CachedRows rows;
  rows.window = s.window;
  if (T <= block_rows) {  // one block a window: every window in one call, window b in slot b
    rows.count.assign(static_cast<size_t>(B), T);
    rows.start.assign(static_cast<size_t>(B), 0);
    for (int64_t b = 0; b < B; ++b) rows.slot.push_back(b);
    attention_forward_cached(q, k.reshape({B, T, ldk}), v.reshape({B, T, ldk}), s.heads, s.kv_heads,
                             rows, ctx, sinks);
    return;
  }
  rows.slot = {0};
  for (int64_t b = 0; b < B; ++b) {  // window b's keys and values as a cache of one slot
    const Tensor kb = k.rows(b * T, (b + 1) * T).reshape({1, T, ldk});
    const Tensor vb = v.rows(b * T, (b + 1) * T).reshape({1, T, ldk});
    for (int64_t r0 = 0; r0 < T; r0 += block_rows) {
      const int64_t r1 = std::min(T, r0 + block_rows);
      rows.count = {r1 - r0};
      rows.start = {r0};
      Tensor out = ctx.rows(b * T + r0, b * T + r1);
      attention_forward_cached(q.rows(b * T + r0, b * T + r1), kb, vb, s.heads, s.kv_heads, rows,
                               out, sinks);
    }
  }
}

void attention_backward(const Tensor& dctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& probs, const AttentionShape& s, Tensor& dq, Tensor& dk,
                        Tensor& dv, const Tensor& sinks, Tensor* dsinks) {
  const PartScope part(StepPart::attention);
  const Device device = require_backend("attention_backward",
                                        {&dctx, &q, &k, &v, &probs, &sinks, &dq, &dk, &dv, dsinks});
  check_attention("attention_backward", q, k, v, s);
  check_sinks("attention_backward", sinks, s.heads);
  if (dsinks) {
    MOE_CHECK(sinks.defined(),
              "attention_backward: a gradient of attention sinks was asked for "
              "without the sinks");
    dsinks->expect_shape(sinks.shape(), "attention_backward sinks gradient");
    dsinks->expect_dtype(DType::f32, "attention_backward sinks gradient");
  }
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
  backend_for(device).dense.attention_backward(dctx, q, k, v, probs, s, sinks, dq, dk, dv,
                                               sinks.defined() ? dsinks : nullptr);
}

}  // namespace moe::ops
