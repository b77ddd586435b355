// One decoder block, pre-norm: h = x + Attn(Norm1(x)); y = h + FFN(Norm2(h)).
// FFN is a dense MLP, an MoE layer, or both summed (PR-MoE residual MoE: MLP + top-1 expert).
// Shapes: x [N, D] with N = B*T tokens.
#pragma once
#include <memory>
#include <optional>

#include "moe/nn/attention.h"
#include "moe/nn/common.h"
#include "moe/nn/mlp.h"
#include "moe/nn/moe_layer.h"
#include "moe/nn/norm.h"

namespace moe::nn {

// min(1, 128 / d_model): how the size-aware defaults shrink with width above d_model 128, the
// width they were tuned at (the blocks' init std scales by its square root, nn/block.cpp; the
// default learning rate by it, train::default_lr). Exactly 1 up to 128.
inline double width_ratio(int64_t d_model) {
  return d_model > 128 ? 128.0 / static_cast<double>(d_model) : 1.0;
}

// What one block is built from: the model's shape and its flavour's choices, as values (the models
// layer fills it in from ModelConfig and Flavour, so nn/ does not depend on models/).
struct BlockConfig {
  int64_t layers = 0;  // blocks in the model (scales the init of the projections into the stream)
  int64_t d_model = 0, heads = 0, kv_heads = 0, d_ff = 0;
  int64_t head_dim = 0;  // 0 = d_model / heads
  int64_t rope_dim = 0;  // rotated features of a head (AttentionConfig::rope_dim); 0 = all
  int64_t dense_ff = 0;  // dense blocks' MLP width when it differs from the experts' d_ff; 0 = d_ff
  int64_t experts = 0;   // this block's experts; 0 = dense
  int64_t top_k = 0;
  bool residual_moe = false, normalize_topk = false;
  double router_jitter = 0, capacity_factor = 0, norm_eps = 0, rope_theta = 0;
  ops::RopeScaling rope_scaling;  // YaRN (AttentionConfig::rope_scaling); {} = plain
  double score_scale = 1.0;       // AttentionConfig::score_scale
  NormKind norm = NormKind::layernorm;
  Activation activation = Activation::gelu;
  bool bias = true, learned_positions = true;
  QkNorm qk_norm = QkNorm::none;
  bool qkv_bias = false;            // q/k/v biases without an o bias (when !bias)
  int64_t shared_expert_ff = 0;     // MoE blocks: the shared expert's hidden width (0 = none)
  bool shared_expert_gate = false;  // its output scaled by sigmoid(x . w) per token (when ff > 0)
  RouterScoring router_scoring = RouterScoring::softmax;
  // MoE blocks: the router's per-expert selection bias (RouterConfig::selection_bias).
  bool router_selection_bias = false;
  bool router_center = false;                        // MoE blocks: RouterConfig::center
  int64_t router_groups = 1, router_group_topk = 1;  // RouterConfig::groups, group_topk
  double router_gate_scale = 1.0;                    // RouterConfig::gate_scale
  MlaConfig mla;                   // latent attention (AttentionConfig::mla) when mla.enabled()
  int64_t window = 0;              // sliding window (AttentionConfig::window); 0 = none
  bool sinks = false;              // attention sinks (AttentionConfig::sinks)
  bool router_logit_bias = false;  // MoE blocks: RouterConfig::logit_bias
  SwigluClamp clamp = {};          // the experts' swiglu_clamped (ExpertsConfig::clamp)
};

class Block {
 public:
  // parallel: the layout over ranks (see moe/nn/parallel.h); null for one process.
  Block(ParamSet& ps, const BlockConfig& config, int64_t index, const Parallel* parallel = nullptr);

  struct Saved {
    Norm::Saved norm1, norm2;
    Attention::Saved attn;
    MLP::Saved mlp;
    MoELayer::Saved moe;
  };
  // stats is filled for MoE blocks (may be nullptr).
  Tensor forward(const Tensor& x, int64_t batch, int64_t seq, const RouterStep& step, Saved* saved,
                 MoEStats* stats) const;
  Tensor backward(const Tensor& dy, const Saved& saved, float aux_scale, float z_scale);
  // Incremental forward (inference, nothing saved): x [N, D] the new tokens of `rows`, attention
  // through the layer's key/value cache (Attention::forward_cached); the FFN / MoE layer sees
  // exactly these N tokens.
  Tensor forward_cached(const Tensor& x, const ops::CachedRows& rows, AttentionCache& cache,
                        const RouterStep& step, MoEStats* stats) const;
  AttentionCache make_cache(int64_t slots, int64_t capacity) const {
    return attn_->make_cache(slots, capacity);
  }

  bool has_moe() const { return moe_ != nullptr; }
  int64_t num_experts() const;
  // Inference with an expert store that reads ahead (nn::ExpertStore::lookahead): the next MoE
  // block, whose norm and router this block applies to its hidden state (after its attention, or
  // its output) to predict that block's experts; set by the model, null for none.
  void set_next_moe(const Block* next) { next_moe_ = next; }

 private:
  // y = h + FFN(Norm2(h)) with h = x + attn (a holds attn on entry).
  Tensor residual_ffn(const Tensor& x, Tensor& a, const RouterStep& step, Saved* saved,
                      MoEStats* stats) const;

  void lookahead(const Tensor& h, LookaheadSource at) const;

  [[maybe_unused]] int64_t index_;  // the block's position in the model (never read yet)
  std::unique_ptr<Norm> norm1_, norm2_;
  std::unique_ptr<Attention> attn_;
  std::unique_ptr<MLP> mlp_;  // dense layers, and the residual branch of residual MoE
  std::unique_ptr<MoELayer> moe_;
  const Block* next_moe_ = nullptr;
};

}  // namespace moe::nn
