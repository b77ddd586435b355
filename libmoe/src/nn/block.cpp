#include "moe/nn/block.h"

#include <cmath>

#include "moe/ops/core.h"

namespace moe::nn {

Block::Block(ParamSet& ps, const BlockConfig& config, int64_t index, const Parallel* parallel)
    : index_(index) {
  const std::string prefix = "blocks." + std::to_string(index);
  // 0.02 up to d_model 128, then 0.02 sqrt(128 / d_model): a block's output is two projections
  // in series on the residual stream, so it grows like d_model x std^2 against the embeddings;
  // with a fixed 0.02 a wide model starts with a residual stream that is mostly one vector shared
  // by every token (attention averages its values), and its routers send every token to the same
  // experts (max/mean load 2.8-3.2 at step 1 at d_model 512, 2.06 with this scale; PERFORMANCE.md).
  const float init_std = 0.02f * std::sqrt(static_cast<float>(width_ratio(config.d_model)));
  // GPT-2: projections into the residual stream scaled by 1/sqrt(2 L).
  const float out_std = init_std / std::sqrt(2.0f * static_cast<float>(config.layers));
  const float eps = static_cast<float>(config.norm_eps);
  norm1_ = std::make_unique<Norm>(ps, prefix + ".norm1", config.d_model, config.norm, eps);
  norm2_ = std::make_unique<Norm>(ps, prefix + ".norm2", config.d_model, config.norm, eps);

  AttentionConfig ac;
  ac.d_model = config.d_model;
  ac.heads = config.heads;
  ac.kv_heads = config.kv_heads;
  ac.head_dim = config.head_dim;
  ac.qk_norm = config.qk_norm;
  ac.norm_eps = eps;
  ac.qkv_bias = config.bias || config.qkv_bias;
  ac.o_bias = config.bias;
  ac.rope = !config.learned_positions;
  ac.rope_theta = static_cast<float>(config.rope_theta);
  ac.rope_scaling = config.rope_scaling;
  ac.score_scale = static_cast<float>(config.score_scale);
  ac.rope_dim = config.rope_dim;
  ac.mla = config.mla;
  ac.window = config.window;
  ac.sinks = config.sinks;
  ac.init_std = init_std;
  ac.out_init_std = out_std;
  attn_ = std::make_unique<Attention>(ps, prefix + ".attn", ac);

  const int64_t experts = config.experts;
  if (experts == 0 || config.residual_moe) {
    MlpConfig mc;
    mc.d_model = config.d_model;
    // GLM-4-MoE's first dense layers are wider than its experts; PR-MoE's residual MLP is d_ff.
    mc.d_ff = experts == 0 && config.dense_ff > 0 ? config.dense_ff : config.d_ff;
    mc.activation = config.activation;
    mc.bias = config.bias;
    mc.init_std = init_std;
    mc.out_init_std = out_std;
    mlp_ = std::make_unique<MLP>(ps, prefix + ".mlp", mc);
  }
  if (experts > 0) {
    MoEConfig moe;
    moe.router.d_model = config.d_model;
    moe.router.num_experts = experts;
    moe.router.top_k = config.residual_moe ? 1 : config.top_k;
    moe.router.normalize_topk = config.normalize_topk;
    moe.router.jitter = static_cast<float>(config.router_jitter);
    moe.router.capacity_factor = static_cast<float>(config.capacity_factor);
    moe.router.scoring = config.router_scoring;
    moe.router.selection_bias = config.router_selection_bias;
    moe.router.center = config.router_center;
    moe.router.groups = config.router_groups;
    moe.router.group_topk = config.router_group_topk;
    moe.router.gate_scale = static_cast<float>(config.router_gate_scale);
    moe.router.logit_bias = config.router_logit_bias;
    // Switch Transformer's router scale: normal(sqrt(0.1 / D)). The router reads a normalised
    // (unit-RMS) stream, so its logits start with std ~sqrt(0.1) at every width; a fixed 0.02
    // gives 0.02 sqrt(D) (0.45 at D 512), sharper gates the wider the model. It does not change
    // which experts a token picks at initialisation: top-k is invariant to scaling the weights.
    moe.router.init_std = static_cast<float>(std::sqrt(0.1 / static_cast<double>(config.d_model)));
    moe.experts.num_experts = experts;
    moe.experts.d_model = config.d_model;
    moe.experts.d_ff = config.d_ff;
    moe.experts.activation = config.activation;
    moe.experts.bias = config.bias;
    moe.experts.clamp = config.clamp;
    moe.experts.init_std = init_std;
    moe.experts.out_init_std = out_std;
    moe.block = index;
    moe.shared_ff = config.shared_expert_ff;
    // Qwen2-MoE's gate scales the shared expert; without one (--shared-expert-ff 0) it has nothing
    // to scale.
    moe.shared_gate = config.shared_expert_gate && config.shared_expert_ff > 0;
    moe_ = std::make_unique<MoELayer>(ps, prefix + ".moe", moe, parallel);
  }
}

int64_t Block::num_experts() const { return moe_ ? moe_->config().router.num_experts : 0; }

Tensor Block::forward(const Tensor& x, int64_t batch, int64_t seq, const RouterStep& step,
                      Saved* saved, MoEStats* stats) const {
  Tensor a = attn_->forward(norm1_->forward(x, saved ? &saved->norm1 : nullptr), batch, seq,
                            saved ? &saved->attn : nullptr);
  return residual_ffn(x, a, step, saved, stats);
}

Tensor Block::forward_cached(const Tensor& x, const ops::CachedRows& rows, AttentionCache& cache,
                             const RouterStep& step, MoEStats* stats) const {
  Tensor a = attn_->forward_cached(norm1_->forward(x, nullptr), rows, cache);
  return residual_ffn(x, a, step, nullptr, stats);
}

Tensor Block::residual_ffn(const Tensor& x, Tensor& a, const RouterStep& step, Saved* saved,
                           MoEStats* stats) const {
  ops::axpy(1.0f, x, a);  // h = x + attn
  if (!saved) lookahead(a, LookaheadSource::input);
  Tensor u = norm2_->forward(a, saved ? &saved->norm2 : nullptr);
  Tensor f;
  if (moe_) {
    f = moe_->forward(u, step, saved ? &saved->moe : nullptr, stats);
    if (mlp_) ops::axpy(1.0f, mlp_->forward(u, saved ? &saved->mlp : nullptr), f);
  } else {
    f = mlp_->forward(u, saved ? &saved->mlp : nullptr);
  }
  ops::axpy(1.0f, a, f);  // y = h + ffn
  if (!saved) lookahead(f, LookaheadSource::output);
  return f;
}

// The next MoE block's input norm and router on h, when its store wants them here: what that
// block's MoE layer would route h to (reads only; h is not changed).
void Block::lookahead(const Tensor& h, LookaheadSource at) const {
  if (!next_moe_) return;
  const ExpertStore* store = next_moe_->moe_->experts().store();
  if (!store) return;
  const Lookahead want = store->lookahead();
  if (want.source != at) return;
  next_moe_->moe_->predict(next_moe_->norm2_->forward(h, nullptr), want.margin);
}

Tensor Block::backward(const Tensor& dy, const Saved& saved, float aux_scale, float z_scale) {
  Tensor du;
  if (moe_) {
    du = moe_->backward(dy, saved.moe, aux_scale, z_scale);
    if (mlp_) ops::axpy(1.0f, mlp_->backward(dy, saved.mlp), du);
  } else {
    du = mlp_->backward(dy, saved.mlp);
  }
  Tensor dh = norm2_->backward(du, saved.norm2);
  ops::axpy(1.0f, dy, dh);  // residual
  Tensor dx = norm1_->backward(attn_->backward(dh, saved.attn), saved.norm1);
  ops::axpy(1.0f, dh, dx);
  return dx;
}

}  // namespace moe::nn
