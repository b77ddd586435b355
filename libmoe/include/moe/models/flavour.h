// What distinguishes the architecture flavours; one .cpp per flavour fills it in.
#pragma once
#include "moe/models/config.h"
#include "moe/nn/common.h"

namespace moe {

struct Flavour {
  nn::NormKind norm = nn::NormKind::layernorm;
  nn::Activation activation = nn::Activation::gelu;
  bool bias = true;                       // biases in attention, MLPs and experts
  bool learned_positions = true;          // else RoPE inside attention
  bool tied_head = true;                  // LM head shares the token embedding
  bool normalize_topk = false;            // default for the router's top-k renormalisation
  nn::QkNorm qk_norm = nn::QkNorm::none;  // RMSNorm of q and k before RoPE
  bool qkv_bias = false;                  // q/k/v biases without an o bias (when !bias)
  bool shared_expert_gate = false;        // shared expert output * sigmoid(x . w) per token
  // What a family's Hugging Face form holds (io/hf_names): shared experts added without a gate
  // (GLM-4-MoE's shared_experts), dense MLP layers (first_k_dense_replace), a router selection
  // bias (e_score_correction_bias).
  bool ungated_shared_expert = false;
  bool dense_layers = false;
  bool router_bias = false;
  // A trained router logit bias (gpt-oss's router.bias; RouterConfig::logit_bias,
  // moe.router.logit_bias [E]), unlike router_bias added to the logits and learned.
  bool router_logit_bias = false;
  bool latent_attention = false;  // DeepSeek-V3's MLA in place of q/k/v (ModelConfig::mla())
  // Attention sinks (gpt-oss's self_attn.sinks; AttentionConfig::sinks, attn.sinks [H] f32).
  bool sinks = false;
};

Flavour gpt_flavour(const ModelConfig& config);          // models/gpt.cpp
Flavour mixtral_flavour(const ModelConfig& config);      // models/mixtral.cpp
Flavour qwen2_moe_flavour(const ModelConfig& config);    // models/qwen2_moe.cpp
Flavour qwen3_moe_flavour(const ModelConfig& config);    // models/qwen3_moe.cpp
Flavour olmoe_flavour(const ModelConfig& config);        // models/olmoe.cpp
Flavour glm4_moe_flavour(const ModelConfig& config);     // models/glm4_moe.cpp
Flavour deepseek_v3_flavour(const ModelConfig& config);  // models/deepseek_v3.cpp
Flavour gpt_oss_flavour(const ModelConfig& config);      // models/gpt_oss.cpp
Flavour flavour_of(const ModelConfig& config);

}  // namespace moe
