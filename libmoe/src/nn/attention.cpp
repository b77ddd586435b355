// Causal self-attention layer: q/k/v projections, qk-norm (qwen3_moe, olmoe), RoPE (mixtral and
// the HF families), the attention core op (with gpt-oss's sinks), and the output projection.
// Shape letters: B batch, T sequence, N = B*T, D model width, H query heads, KV key/value heads,
// hd head dim.
#include "moe/nn/attention.h"

#include <algorithm>

#include "moe/ops/core.h"
#include "moe/ops/dense.h"

namespace moe::nn {

namespace {

AttentionConfig resolved(const std::string& prefix, AttentionConfig c) {
  if (c.mla.enabled()) {  // Mla checks its own shape
    c.kv_heads = c.heads;
    c.head_dim = c.mla.head_dim();
    c.rope = true;
    c.rope_dim = c.mla.qk_rope;
    c.qkv_bias = false;
    c.qk_norm = QkNorm::none;
  }
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  MOE_USAGE_CHECK(c.d_model > 0 && c.heads > 0, "attention ", prefix, ": d_model ", c.d_model,
                  " and heads ", c.heads, " must be positive");
  MOE_USAGE_CHECK(c.head_dim >= 0, "attention ", prefix, ": head_dim ", c.head_dim,
                  " must be positive (or 0 for d_model / heads)");
  if (c.head_dim == 0) {
    MOE_USAGE_CHECK(c.d_model % c.heads == 0, "attention ", prefix, ": d_model ", c.d_model,
                    " must be a multiple of heads ", c.heads, " (or give head_dim)");
    c.head_dim = c.d_model / c.heads;
  }
  MOE_USAGE_CHECK(c.window >= 0 && (c.window == 0 || !c.mla.enabled()), "attention ", prefix,
                  ": a sliding window of ", c.window,
                  " positions (it must be >= 0, 0 = none; latent attention has none)");
  MOE_USAGE_CHECK(!c.sinks || !c.mla.enabled(), "attention ", prefix,
                  ": attention sinks do not combine with latent attention");
  MOE_USAGE_CHECK(c.kv_heads > 0 && c.heads % c.kv_heads == 0, "attention ", prefix, ": kv_heads ",
                  c.kv_heads, " must divide heads ", c.heads);
  MOE_USAGE_CHECK(!c.rope || (c.head_dim % 2 == 0 && c.rope_theta > 0.0f), "attention ", prefix,
                  ": RoPE needs an even head dim (got ", c.head_dim, ") and theta > 0 (got ",
                  c.rope_theta, ")");
  return c;
}

// Query rows a block when inference runs attention by blocks: a thread's scores of a block are
// rows x T floats, 4 MiB of them (T 4096: 256 rows), at least 64 rows and at most 512 (windows of
// up to 512 tokens stay one block, as they were before blocks).
int64_t inference_block_rows(int64_t seq) {
  return std::clamp<int64_t>((int64_t(1) << 20) / std::max<int64_t>(seq, 1), 64, 512);
}

}  // namespace

Attention::Attention(ParamSet& ps, const std::string& prefix, const AttentionConfig& config)
    : config_(resolved(prefix, config)), name_(prefix), head_dim_(config_.head_dim) {
  // Params in the order q, k, v, o, norms (initialisation draws in that order).
  const int64_t q_out = config_.heads * head_dim_, kv_out = config_.kv_heads * head_dim_;
  if (config_.mla.enabled()) {
    mla_ = std::make_unique<Mla>(ps, prefix, config_.d_model, config_.heads, config_.mla,
                                 config_.norm_eps, config_.init_std);
  } else {
    q_ = std::make_unique<Linear>(ps, prefix + ".q", config_.d_model, q_out, config_.qkv_bias,
                                  config_.init_std);
    k_ = std::make_unique<Linear>(ps, prefix + ".k", config_.d_model, kv_out, config_.qkv_bias,
                                  config_.init_std);
    v_ = std::make_unique<Linear>(ps, prefix + ".v", config_.d_model, kv_out, config_.qkv_bias,
                                  config_.init_std);
  }
  const int64_t o_in = mla_ ? config_.heads * config_.mla.v_head_dim : q_out;
  o_ = std::make_unique<Linear>(ps, prefix + ".o", o_in, config_.d_model, config_.o_bias,
                                config_.out_init_std);
  if (config_.qk_norm != QkNorm::none) {
    // The per-head norm is the ordinary row RMSNorm over [N*heads, hd]: its one weight [hd] then
    // gets the gradient summed over every head, as a weight shared by the heads must.
    const bool per_head = config_.qk_norm == QkNorm::head;
    q_norm_ = std::make_unique<Norm>(ps, prefix + ".q_norm",
                                     per_head ? head_dim_ : config_.heads * head_dim_,
                                     NormKind::rmsnorm, config_.norm_eps);
    k_norm_ = std::make_unique<Norm>(ps, prefix + ".k_norm",
                                     per_head ? head_dim_ : config_.kv_heads * head_dim_,
                                     NormKind::rmsnorm, config_.norm_eps);
  }
  if (config_.sinks)  // last: a model without sinks draws its other params as before
    sinks_ = &ps.add(prefix + ".sinks", {config_.heads}, Init::zeros(), /*decay=*/false,
                     /*expert=*/false, DType::f32);
}

Tensor Attention::qk_normed(const Norm* norm, const Tensor& t, int64_t heads,
                            Norm::Saved* saved) const {
  if (!norm) return t;
  const Tensor rows =
      config_.qk_norm == QkNorm::head ? t.reshape({t.dim(0) * heads, head_dim_}) : t;
  return norm->forward(rows, saved).reshape(t.shape());
}

Tensor Attention::qk_norm_backward(Norm* norm, const Tensor& dt, int64_t heads,
                                   const Norm::Saved& saved) const {
  if (!norm) return dt;
  const Tensor rows =
      config_.qk_norm == QkNorm::head ? dt.reshape({dt.dim(0) * heads, head_dim_}) : dt;
  return norm->backward(rows, saved).reshape(dt.shape());
}

void Attention::project(const Tensor& x, Tensor& q, Tensor& k, Tensor& v, Saved* saved) const {
  if (mla_) {
    Mla::Projected p = mla_->project(x, saved ? &saved->mla : nullptr);
    q = p.q;
    k = mla_->keys(p.k_pe, p.k_nope);  // RoPE then rotates every head's copy of k_pe alike
    v = mla_->pad_values(p.v);
    return;
  }
  q = qk_normed(q_norm_.get(), q_->forward(x), config_.heads, saved ? &saved->q_norm : nullptr);
  k = qk_normed(k_norm_.get(), k_->forward(x), config_.kv_heads, saved ? &saved->k_norm : nullptr);
  v = v_->forward(x);
}

Tensor Attention::project_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                   const Saved& saved) {
  if (mla_) {
    Tensor dk_pe, dk_nope;
    mla_->keys_backward(dk, dk_pe, dk_nope);
    return mla_->backward(dq, dk_pe, dk_nope, mla_->unpad_values(dv), saved.mla);
  }
  const Tensor dqn = qk_norm_backward(q_norm_.get(), dq, config_.heads, saved.q_norm);
  const Tensor dkn = qk_norm_backward(k_norm_.get(), dk, config_.kv_heads, saved.k_norm);
  Tensor dx = Tensor::empty(saved.x.shape(), DType::f32, saved.x.device());
  q_->backward_into(dqn, saved.x, dx, false);
  k_->backward_into(dkn, saved.x, dx, true);
  v_->backward_into(dv, saved.x, dx, true);
  return dx;
}

Tensor Attention::forward(const Tensor& x, int64_t batch, int64_t seq, Saved* saved) const {
  MOE_CHECK(batch >= 0 && seq >= 0 && x.ndim() == 2 && x.dim(0) == batch * seq &&
                x.dim(1) == config_.d_model,
            "attention ", name_, ": input ", x.describe(), " expected [", batch * seq, ",",
            config_.d_model, "] for batch ", batch, ", seq ", seq);
  Tensor q, k, v;
  project(x, q, k, v, saved);
  if (config_.rope) {
    ops::rope_forward(q, batch, seq, config_.heads, config_.rope_theta, q, 0, config_.rope_dim,
                      config_.rope_scaling);
    ops::rope_forward(k, batch, seq, config_.kv_heads, config_.rope_theta, k, 0, config_.rope_dim,
                      config_.rope_scaling);
  }
  if (config_.score_scale != 1.0f) ops::scale(q, config_.score_scale);
  const ops::AttentionShape shape{batch,     seq,           config_.heads, config_.kv_heads,
                                  head_dim_, config_.window};
  Tensor ctx = Tensor::empty(q.shape(), DType::f32, q.device());
  if (!saved) {  // inference: no [B,H,T,T] probabilities, query blocks instead
    ops::attention_forward_blocks(q, k, v, shape, inference_block_rows(seq), ctx, sinks());
    return o_->forward(mla_ ? mla_->unpad_values(ctx) : ctx);
  }
  Tensor probs = Tensor::empty({batch, config_.heads, seq, seq}, DType::f32, q.device());
  ops::attention_forward(q, k, v, shape, probs, ctx, sinks());
  saved->x = x;
  saved->q = q;
  saved->k = k;
  saved->v = v;
  saved->probs = probs;
  saved->ctx = mla_ ? mla_->unpad_values(ctx) : ctx;
  saved->batch = batch;
  saved->seq = seq;
  return o_->forward(saved->ctx);
}

AttentionCache Attention::make_cache(int64_t slots, int64_t capacity) const {
  MOE_CHECK(slots >= 0 && capacity >= 0, "attention ", name_, ": cache of ", slots, " slots and ",
            capacity, " positions");
  if (mla_) return make_latent_cache(slots, capacity);
  const int64_t width = config_.kv_heads * head_dim_;
  const Device device = o_->weight().value.device();  // the cache lives with the weights
  AttentionCache cache;
  cache.k = Tensor::zeros({slots, capacity, width}, DType::f32, device).set_name("attn.k_cache");
  cache.v = Tensor::zeros({slots, capacity, width}, DType::f32, device).set_name("attn.v_cache");
  return cache;
}

Tensor Attention::forward_cached(const Tensor& x, const ops::CachedRows& rows,
                                 AttentionCache& cache) const {
  if (mla_) return forward_cached_latent(x, rows, cache);
  const int64_t n = rows.tokens(), width = config_.kv_heads * head_dim_;
  MOE_CHECK(x.ndim() == 2 && x.dim(0) == n && x.dim(1) == config_.d_model, "attention ", name_,
            ": cached input ", x.describe(), " expected [", n, ",", config_.d_model, "]");
  MOE_CHECK(cache.k.defined() && cache.k.ndim() == 3 && cache.k.dim(2) == width &&
                cache.v.shape() == cache.k.shape(),
            "attention ", name_, ": cache ", cache.k.describe(), " does not fit ", config_.kv_heads,
            " kv heads of ", head_dim_);
  const int64_t capacity = cache.k.dim(1);
  rows.check(cache.k.dim(0), capacity, "attention cache");
  Tensor q, k, v;
  project(x, q, k, v, nullptr);
  int64_t first = 0;
  for (int64_t r = 0; r < rows.rows(); ++r) {
    const int64_t t = rows.count[r], start = rows.start[r];
    if (config_.rope) {  // each row at its own positions
      Tensor qr = q.rows(first, first + t), kr = k.rows(first, first + t);
      ops::rope_forward(qr, 1, t, config_.heads, config_.rope_theta, qr, start, config_.rope_dim,
                        config_.rope_scaling);
      ops::rope_forward(kr, 1, t, config_.kv_heads, config_.rope_theta, kr, start, config_.rope_dim,
                        config_.rope_scaling);
    }
    // The row's new keys and values into its slot, on the cache's device (a copy, not memcpy: the
    // cache may be in GPU memory).
    const int64_t at = rows.slot[r] * capacity + start;
    for (auto [to, from] : {std::pair{&cache.k, &k}, std::pair{&cache.v, &v}})
      to->reshape({to->dim(0) * capacity, width})
          .rows(at, at + t)
          .copy_from(from->reshape({n, width}).rows(first, first + t));
    first += t;
  }
  if (config_.score_scale != 1.0f) ops::scale(q, config_.score_scale);
  Tensor ctx = Tensor::empty(q.shape(), DType::f32, q.device());
  if (config_.window != rows.window) {  // the rows come shared by every layer, windowed or not
    ops::CachedRows windowed = rows;
    windowed.window = config_.window;
    ops::attention_forward_cached(q, cache.k, cache.v, config_.heads, config_.kv_heads, windowed,
                                  ctx, sinks());
  } else {
    ops::attention_forward_cached(q, cache.k, cache.v, config_.heads, config_.kv_heads, rows, ctx,
                                  sinks());
  }
  return o_->forward(mla_ ? mla_->unpad_values(ctx) : ctx);
}

Tensor Attention::backward(const Tensor& dy, const Saved& saved) {
  MOE_CHECK(saved.x.defined() && saved.probs.defined(), "attention ", name_,
            ": backward without a saved forward");
  const int64_t batch = saved.batch, seq = saved.seq;
  Tensor dctx = o_->backward(dy, saved.ctx);
  if (mla_) dctx = mla_->pad_values(dctx);
  Tensor dq = Tensor::empty(saved.q.shape(), DType::f32, saved.q.device()),
         dk = Tensor::empty(saved.k.shape(), DType::f32, saved.q.device()),
         dv = Tensor::empty(saved.v.shape(), DType::f32, saved.q.device());
  const ops::AttentionShape shape{batch,     seq,           config_.heads, config_.kv_heads,
                                  head_dim_, config_.window};
  // A frozen or gradient-less sinks param (Param::frozen, ParamSet::skip_gradients) gets none.
  Tensor* dsinks = sinks_ && !sinks_->frozen && sinks_->grad.defined() ? &sinks_->grad : nullptr;
  ops::attention_backward(dctx, saved.q, saved.k, saved.v, saved.probs, shape, dq, dk, dv, sinks(),
                          dsinks);
  if (config_.score_scale != 1.0f) ops::scale(dq, config_.score_scale);  // saved.q was scaled
  if (config_.rope) {
    ops::rope_backward(dq, batch, seq, config_.heads, config_.rope_theta, dq, 0, config_.rope_dim,
                       config_.rope_scaling);
    ops::rope_backward(dk, batch, seq, config_.kv_heads, config_.rope_theta, dk, 0,
                       config_.rope_dim, config_.rope_scaling);
  }
  return project_backward(dq, dk, dv, saved);
}

}  // namespace moe::nn
