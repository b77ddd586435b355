// The model's shape and numerics: everything needed to rebuild it from a checkpoint.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "moe/dtype.h"
#include "moe/nn/common.h"
#include "moe/rope_scaling.h"

namespace moe {

// gpt: GPT-2/Switch; mixtral and the families built on its layers (RMSNorm, RoPE, SwiGLU experts,
// untied head): qwen2_moe (q/k/v biases, gated shared expert), qwen3_moe (per-head qk-norm),
// olmoe (full-width qk-norm), glm4_moe (partial RoPE, ungated shared experts, first layers dense,
// sigmoid router with a selection bias and group-limited top-k), deepseek_v3 (DeepSeek-V2/V3:
// glm4_moe's MoE layers with Multi-head Latent Attention), gpt_oss (OpenAI gpt-oss: biases
// everywhere, attention sinks, the clamped SwiGLU, a router logit bias, softmax over the top-k).
// One file per family under models/ says what differs.
enum class Arch { gpt, mixtral, qwen2_moe, qwen3_moe, olmoe, glm4_moe, deepseek_v3, gpt_oss };
Arch parse_arch(const std::string& name);  // UsageError naming the accepted values
const char* arch_name(Arch arch);
nn::RouterScoring parse_router_scoring(const std::string& name);  // softmax | sigmoid
const char* router_scoring_name(nn::RouterScoring scoring);
enum class RopeType { none, yarn };
RopeType parse_rope_type(const std::string& name);  // none | yarn
const char* rope_type_name(RopeType type);

// Bounds checked before anything is sized by them: layers (as import-hf bounds
// num_hidden_layers), and the context (positions are 32-bit ids).
inline constexpr int64_t kMaxLayers = int64_t(1) << 16;
inline constexpr int64_t kMaxSeq = (int64_t(1) << 31) - 1;

struct ModelConfig {
  Arch arch = Arch::gpt;
  int64_t vocab_size = 256;  // byte-level by default
  int64_t layers = 4;
  int64_t d_model = 128;
  int64_t heads = 4;
  int64_t kv_heads = 0;  // 0 = heads (no grouping); mixtral may use fewer
  int64_t d_ff = 512;    // hidden width of dense MLPs and of each expert
  int64_t head_dim = 0;  // 0 = d_model / heads; else q is heads*head_dim wide (Qwen3-MoE)
  // Hidden width of the dense layers' MLPs when it differs from the experts' d_ff (GLM-4-MoE's
  // first_k_dense_replace layers: intermediate_size); 0 = d_ff.
  int64_t dense_ff = 0;
  // Features of each head that RoPE rotates (the first ones; GLM-4-MoE: head_dim *
  // partial_rotary_factor); 0 = all of head_dim.
  int64_t rope_dim = 0;
  // glm4_moe (attention_bias, use_qk_norm): q/k/v biases, per-head qk-norm. The other families
  // fix these in their flavour and leave them false.
  bool qkv_bias = false, qk_norm = false;
  // Multi-head Latent Attention (deepseek_v3 only; nn::MlaConfig): kv_lora_rank > 0 turns it on.
  // q_lora_rank 0 = a plain q projection (DeepSeek-V2-Lite); q/k heads are qk_nope_dim +
  // qk_rope_dim wide (head_dim and rope_dim are then unused, 0), values v_head_dim.
  int64_t q_lora_rank = 0, kv_lora_rank = 0;
  int64_t qk_nope_dim = 0, qk_rope_dim = 0, v_head_dim = 0;
  // Hidden width of the always-on shared expert of every MoE layer (its output is added to the
  // routed experts'); 0 = none. n shared experts of width F are one of width n F.
  int64_t shared_expert_ff = 0;
  int64_t seq = 128;    // context length (learned positions for gpt)
  int64_t experts = 8;  // experts per MoE layer unless experts_per_layer says otherwise
  std::vector<int64_t> experts_per_layer;  // resolved by resolve(): one entry per layer, 0 = dense
  int64_t moe_every = 2;                   // every K-th layer (layers K-1, 2K-1, ...) is MoE
  int64_t top_k = 2;
  double capacity_factor = 0;  // 0 = dropless
  double aux_loss_coef = 0.01;
  double z_loss_coef = 0.001;
  bool residual_moe = false;    // PR-MoE: dense MLP + one (top-1) expert
  bool normalize_topk = false;  // renormalise top-k gate weights (mixtral default)
  double router_jitter = 0;
  nn::RouterScoring router_scoring = nn::RouterScoring::softmax;
  // Aux-loss-free balancing (DeepSeek-V3): after each training step every MoE layer's selection
  // bias moves by u * sign(mean load - load_e); 0 = off.
  double balance_bias_rate = 0;
  // Group-limited top-k (DeepSeek-V3, GLM-4-MoE n_group / topk_group): experts in router_groups
  // equal groups, chosen only within the router_group_topk best (nn::RouterConfig::groups); 1 =
  // off.
  int64_t router_groups = 1, router_group_topk = 1;
  // Every gate weight times this (routed_scaling_factor; nn::RouterConfig::gate_scale).
  double routed_scale = 1.0;
  // Router centring: each router's weight acts as W - C (W c) c^T / |c|^2, c the running mean of
  // its input (moe.router.center, moved toward each training step's mean by this rate; 0 = off).
  // Routing then ignores the part of the input every token shares (nn::RouterConfig::center).
  double router_center_rate = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000;
  // RoPE scaling (HF rope_scaling / rope_parameters' rope_type): none, or YaRN (DeepSeek-V2/V3,
  // gpt-oss, long-context Qwen configs) with its settings as the HF config names them
  // (ops::YarnSettings: factor, original_max_position_embeddings, beta_fast, beta_slow, mscale,
  // mscale_all_dim, attention_factor, truncate). rope_scaling() and attention_scale() derive what
  // the layers use.
  RopeType rope_type = RopeType::none;
  ops::YarnSettings yarn;
  DType dtype = DType::f32;  // parameter and activation storage
  // Sliding-window attention (Mixtral's sliding_window, Qwen's use_sliding_window, gpt-oss's
  // layer_types): a windowed layer's query sees the last sliding_window positions, itself
  // included (kernels::window_first_key); 0 = none. window_layers: the windowed layers' indices,
  // ascending; empty = every layer.
  int64_t sliding_window = 0;
  std::vector<int64_t> window_layers;
  // The LM head reads the token embedding (tie_word_embeddings): one parameter, whose gradient
  // sums the embedding's and the head's. gpt always ties; the other families when this is set.
  bool tie_embeddings = false;
  // gpt_oss's clamped SwiGLU (HF swiglu_alpha, swiglu_limit; SwigluClamp): the sigmoid's slope
  // and the clamp of gate and up. Read by gpt_oss alone; the other families keep the defaults.
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;

  int64_t kv_heads_resolved() const { return kv_heads ? kv_heads : heads; }
  // The q/k head width (latent attention: qk_nope_dim + qk_rope_dim).
  int64_t head_dim_resolved() const {
    return mla() ? qk_nope_dim + qk_rope_dim : head_dim ? head_dim : d_model / heads;
  }
  int64_t dense_ff_resolved() const { return dense_ff ? dense_ff : d_ff; }
  int64_t rope_dim_resolved() const {
    return mla() ? qk_rope_dim : rope_dim ? rope_dim : head_dim_resolved();
  }
  // Whether the routers carry a per-expert selection bias (moe.router.bias): sigmoid routers
  // always (DeepSeek-V3), softmax ones only while the aux-loss-free update moves it.
  bool router_selection_bias() const {
    return router_scoring == nn::RouterScoring::sigmoid || balance_bias_rate > 0;
  }
  bool router_center() const { return router_center_rate > 0; }
  // The RoPE kernels' frequency input for rope_dim_resolved() features (plain RoPE without YaRN).
  ops::RopeScaling rope_scaling() const;
  // The softmax scale's factor beyond 1/sqrt(q/k head dim): deepseek_v3's YaRN with
  // mscale_all_dim > 0 multiplies it by yarn_mscale(factor, mscale_all_dim)^2 (transformers'
  // yarn_apply_mscale, DeepSeek-V2/V3 only); 1 otherwise.
  double attention_scale() const;
  bool mla() const { return kv_lora_rank > 0; }
  bool is_moe_layer(int64_t layer) const { return experts_per_layer.at(layer) > 0; }
  int64_t num_moe_layers() const;
  // The block index of each MoE layer, in order (MoE layer l is block moe_blocks()[l]).
  std::vector<int64_t> moe_blocks() const;
  bool tied_embeddings() const { return arch == Arch::gpt || tie_embeddings; }
  // Layer `layer`'s window (0: it attends to every earlier position).
  int64_t window_of(int64_t layer) const;

  // Fill experts_per_layer from experts/moe_every (or expand a per-MoE-layer list), then check
  // every constraint; throws UsageError with the flag names a user typed.
  void resolve();
  void validate() const;

 private:
  void validate_mla() const;     // the latent attention's fields (deepseek_v3's alone)
  void validate_rope() const;    // rope_type and yarn
  void validate_window() const;  // sliding_window and window_layers
  void validate_swiglu() const;  // swiglu_alpha and swiglu_limit
};

nlohmann::json to_json(const ModelConfig& config);
ModelConfig model_config_from_json(const nlohmann::json& j);  // Error naming the missing/bad key

}  // namespace moe
