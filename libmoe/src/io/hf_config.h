// config.json of a Hugging Face MoE checkpoint: the fields of each family under every spelling
// transformers writes (transformers 4 and 5). Private to libmoe (hf_checkpoint.cpp).
// Shape letters as in hf_checkpoint.cpp.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/models/config.h"

namespace moe::io::hf {

// What import-hf reads of config.json.
struct HfModel {
  std::string family;
  Arch arch = Arch::mixtral;
  int64_t vocab = 0, hidden = 0, ffn = 0, layers = 0, heads = 0, kv_heads = 0, experts = 0,
          top_k = 0, max_positions = 0;
  int64_t head_dim = 0;  // 0: hidden / heads
  // Sliding-window attention as transformers 5 applies it (0: none) on window_layers (empty:
  // every layer); ModelConfig::sliding_window and window_layers.
  int64_t sliding_window = 0;
  std::vector<int64_t> window_layers;
  bool tied = false;      // tie_word_embeddings: the LM head is the token embedding
  int64_t shared_ff = 0;  // Qwen2-MoE shared_expert_intermediate_size; GLM n_shared_experts * F
  double rope_theta = 10000, eps = 1e-6, aux_coef = 0, jitter = 0;
  RopeType rope_type = RopeType::none;  // rope_scaling / rope_parameters "yarn": its settings
  ops::YarnSettings yarn;
  bool normalize = true;
  // GLM-4-MoE: the first `dense_layers` layers are MLPs of width dense_ff; RoPE on rope_dim
  // features of a head (0: all); q/k/v biases; per-head qk-norm; DeepSeek-V3's router (sigmoid,
  // selection bias, groups, scale); multi-token-prediction layers after the last (skipped).
  int64_t dense_layers = 0, dense_ff = 0, rope_dim = 0;
  bool qkv_bias = false, qk_norm = false, sigmoid_router = false;
  int64_t groups = 1, group_topk = 1, extra_layers = 0;
  double routed_scale = 1.0;
  // DeepSeek-V3's latent attention (q_lora 0: a plain q_proj); rope_interleave: the RoPE features
  // of q_b_proj / kv_a_proj_with_mqa rows in interleaved pairs (DeepSeek's layout).
  int64_t q_lora = 0, kv_lora = 0, qk_nope = 0, qk_rope = 0, v_head = 0;
  bool rope_interleave = true;
  // gpt-oss: the clamped SwiGLU's slope and clamp (ModelConfig::swiglu_alpha, swiglu_limit); its
  // experts stored as MXFP4 _blocks/_scales (quantization_config quant_method "mxfp4").
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;
  bool mxfp4 = false;
};

// Reads config.json (`path` names it in messages); features our model lacks go to `unsupported`.
HfModel parse_config(const nlohmann::json& j, const std::string& path,
                     std::vector<std::string>& unsupported);

}  // namespace moe::io::hf
