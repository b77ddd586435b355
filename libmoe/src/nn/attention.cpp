// Causal self-attention layer: q/k/v projections, RoPE (mixtral), the attention core op, and the
// output projection. Shape letters: B batch, T sequence, N = B*T, D model width, H query heads,
// KV key/value heads, hd head dim.
#include "moe/nn/attention.h"

#include "moe/ops/dense.h"

namespace moe::nn {

namespace {

AttentionConfig resolved(const std::string& prefix, AttentionConfig c) {
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  MOE_USAGE_CHECK(c.d_model > 0 && c.heads > 0 && c.d_model % c.heads == 0, "attention ", prefix,
                  ": d_model ", c.d_model, " must be a positive multiple of heads ", c.heads);
  MOE_USAGE_CHECK(c.kv_heads > 0 && c.heads % c.kv_heads == 0, "attention ", prefix, ": kv_heads ",
                  c.kv_heads, " must divide heads ", c.heads);
  MOE_USAGE_CHECK(!c.rope || ((c.d_model / c.heads) % 2 == 0 && c.rope_theta > 0.0f), "attention ",
                  prefix, ": RoPE needs an even head dim (got ", c.d_model / c.heads,
                  ") and theta > 0 (got ", c.rope_theta, ")");
  return c;
}

}  // namespace

Attention::Attention(ParamSet& ps, const std::string& prefix, const AttentionConfig& config)
    : config_(resolved(prefix, config)),
      head_dim_(config_.d_model / config_.heads),
      q_(ps, prefix + ".q", config_.d_model, config_.heads * head_dim_, config_.bias,
         config_.init_std),
      k_(ps, prefix + ".k", config_.d_model, config_.kv_heads * head_dim_, config_.bias,
         config_.init_std),
      v_(ps, prefix + ".v", config_.d_model, config_.kv_heads * head_dim_, config_.bias,
         config_.init_std),
      o_(ps, prefix + ".o", config_.heads * head_dim_, config_.d_model, config_.bias,
         config_.out_init_std) {}

Tensor Attention::forward(const Tensor& x, int64_t batch, int64_t seq, Saved* saved) const {
  MOE_CHECK(batch >= 0 && seq >= 0 && x.ndim() == 2 && x.dim(0) == batch * seq &&
                x.dim(1) == config_.d_model,
            "attention ", q_.weight().name, ": input ", x.describe(), " expected [", batch * seq,
            ",", config_.d_model, "] for batch ", batch, ", seq ", seq);
  Tensor q = q_.forward(x), k = k_.forward(x), v = v_.forward(x);
  if (config_.rope) {
    ops::rope_forward(q, batch, seq, config_.heads, config_.rope_theta, q);
    ops::rope_forward(k, batch, seq, config_.kv_heads, config_.rope_theta, k);
  }
  const ops::AttentionShape shape{batch, seq, config_.heads, config_.kv_heads, head_dim_};
  Tensor probs = Tensor::empty({batch, config_.heads, seq, seq});
  Tensor ctx = Tensor::empty(q.shape());
  ops::attention_forward(q, k, v, shape, probs, ctx);
  Tensor y = o_.forward(ctx);
  if (saved) {
    saved->x = x;
    saved->q = q;
    saved->k = k;
    saved->v = v;
    saved->probs = probs;
    saved->ctx = ctx;
    saved->batch = batch;
    saved->seq = seq;
  }
  return y;
}

Tensor Attention::backward(const Tensor& dy, const Saved& saved) {
  MOE_CHECK(saved.x.defined() && saved.probs.defined(), "attention ", q_.weight().name,
            ": backward without a saved forward");
  const int64_t batch = saved.batch, seq = saved.seq;
  Tensor dctx = o_.backward(dy, saved.ctx);
  Tensor dq = Tensor::empty(saved.q.shape()), dk = Tensor::empty(saved.k.shape()),
         dv = Tensor::empty(saved.v.shape());
  const ops::AttentionShape shape{batch, seq, config_.heads, config_.kv_heads, head_dim_};
  ops::attention_backward(dctx, saved.q, saved.k, saved.v, saved.probs, shape, dq, dk, dv);
  if (config_.rope) {
    ops::rope_backward(dq, batch, seq, config_.heads, config_.rope_theta, dq);
    ops::rope_backward(dk, batch, seq, config_.kv_heads, config_.rope_theta, dk);
  }
  Tensor dx = Tensor::empty(saved.x.shape());
  q_.backward_into(dq, saved.x, dx, false);
  k_.backward_into(dk, saved.x, dx, true);
  v_.backward_into(dv, saved.x, dx, true);
  return dx;
}

}  // namespace moe::nn
