// deepseek_v3 flavour (HF DeepseekV3 / DeepseekV2: DeepSeek-V3, R1, Kimi K2, V2, V2-Lite):
// glm4_moe's blocks (RMSNorm, SwiGLU experts, ungated shared experts, the first layers dense MLPs
// of their own width, the router with a selection bias, group-limited top-k and routed_scale)
// with Multi-head Latent Attention in place of q/k/v (nn/mla.h; ModelConfig's q_lora_rank,
// kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim): no q/k/v biases, no qk-norm. DeepSeek-V2's
// softmax router is router_scoring softmax without the selection bias.
#include "moe/models/flavour.h"

namespace moe {

Flavour deepseek_v3_flavour(const ModelConfig& config) {
  Flavour f = mixtral_flavour(config);
  f.normalize_topk = true;  // norm_topk_prob; import sets ModelConfig's from the config
  f.ungated_shared_expert = true;
  f.dense_layers = true;
  f.router_bias = config.router_selection_bias();
  f.latent_attention = true;
  return f;
}

}  // namespace moe
