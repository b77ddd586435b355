// glm4_moe flavour (HF Glm4Moe: GLM-4.5, GLM-4.5-Air, GLM-4.6): mixtral's layers with q/k/v
// biases when the config asks (attention_bias; o has none), an optional per-head qk-norm
// (use_qk_norm), RoPE on the first rope_dim features of each head only (partial_rotary_factor,
// halves of those rotated as in the other families), shared experts added without a gate, the
// first layers dense MLPs of their own width (dense_ff), and DeepSeek-V3's router: sigmoid scores,
// a selection bias (e_score_correction_bias) for the choice only, group-limited top-k, the chosen
// scores renormalised (norm_topk_prob) and scaled (routed_scale). The shape-level options live in
// ModelConfig; this file says which layers the family's blocks have.
#include "moe/models/flavour.h"

namespace moe {

Flavour glm4_moe_flavour(const ModelConfig& config) {
  Flavour f = mixtral_flavour(config);
  f.qkv_bias = config.qkv_bias;
  f.qk_norm = config.qk_norm ? nn::QkNorm::head : nn::QkNorm::none;
  f.normalize_topk = true;  // norm_topk_prob's default; import-hf sets ModelConfig's from config
  f.ungated_shared_expert = true;
  f.dense_layers = true;
  f.router_bias = true;
  return f;
}

}  // namespace moe
