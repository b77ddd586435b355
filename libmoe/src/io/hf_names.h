// Hugging Face MoE checkpoint names: the files of a checkpoint directory, and the tensor names
// (Mixtral, OLMoE, Qwen2/3-MoE) with where each goes in our model: which block slot, which expert,
// or why it cannot be imported. Private to libmoe (hf_checkpoint.cpp, hf_export.cpp).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include "moe/models/config.h"
#include "moe/models/flavour.h"

namespace moe::io::hf {

// The files of a Hugging Face checkpoint directory.
inline constexpr const char* kSingleFile = "model.safetensors";
inline constexpr const char* kIndexFile = "model.safetensors.index.json";
inline constexpr const char* kConfigFile = "config.json";
// Our exporter's record of the exact model config, in the safetensors metadata.
inline constexpr const char* kMetadataConfig = "moe.model_config";

inline std::string join_path(const std::string& dir, const std::string& file) {
  return (std::filesystem::path(dir) / file).string();
}

// A layer's tensors. q/k/v_bias (Qwen2-MoE), q/k_norm (Qwen3-MoE per head, OLMoE full width) and
// the shared_* ones (Qwen2-MoE's shared expert and its sigmoid gate) belong to some families only.
enum class Slot {
  norm1,
  norm2,
  q,
  k,
  v,
  o,
  q_bias,
  k_bias,
  v_bias,
  q_norm,
  k_norm,
  router,
  w1,
  w2,
  w3,
  gate_up,
  down,
  shared_w1,
  shared_w2,
  shared_w3,
  shared_gate,
  router_bias,  // GLM-4-MoE's e_score_correction_bias: the router's selection bias
  dense_w1,     // a dense layer's MLP (GLM-4-MoE's first_k_dense_replace layers)
  dense_w2,
  dense_w3,
  // DeepSeek-V3's latent attention (self_attn.q_a_proj, q_a_layernorm, q_b_proj,
  // kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj); its plain q_proj and o_proj are q and o.
  // kv_a and kv_b each become two of our params, and q / q_b rows are reordered (io/hf_mla.h).
  mla_q_a,
  mla_q_a_norm,
  mla_q_b,
  mla_kv_a,
  mla_kv_a_norm,
  mla_kv_b,
  // gpt-oss: the o bias, the attention sinks, the router's logit bias, the fused experts' biases
  // (gate_up_proj_bias [E, 2F] interleaved, down_proj_bias [E, D]) and the MXFP4 form of
  // gate_up_proj / down_proj (_blocks U8 [E, rows, in/32, 16], _scales U8 [E, rows, in/32]).
  o_bias,
  sinks,
  router_logit_bias,
  gate_up_bias,
  down_bias,
  gate_up_blocks,
  gate_up_scales,
  down_blocks,
  down_scales
};

struct Classified {
  enum Kind { mapped, derived, unsupported, unmapped } kind = unmapped;
  std::string our;  // embed.tokens, final_norm.weight, lm_head.weight, or "" for layer slots
  int64_t layer = -1, expert = -1;
  Slot slot = Slot::norm1;
  std::string feature;  // unsupported: what
};

// Our architecture of a config.json model_type (mixtral, qwen2_moe, qwen3_moe, olmoe, glm4_moe,
// gpt_oss: the names agree; deepseek_v2 and deepseek_v3: deepseek_v3), and back; other types throw
// naming the supported ones.
Arch arch_of_family(const std::string& model_type, const std::string& config_path);
inline const char* family_of(Arch arch) { return arch_name(arch); }

// The family feature a slot belongs to ("attention biases", "qk-norm (...)", "shared expert"),
// or nullptr for the slots every family has; and whether `flavour` has that feature.
const char* slot_feature(Slot s);
bool flavour_has(const Flavour& flavour, Slot s);

// What `name` is: one of our outer tensors (embed.tokens, final_norm.weight, lm_head.weight), a
// block slot (layer, and expert for per-expert tensors), a tensor derived from the config (RoPE
// frequencies), a feature we lack (feature says which), or nothing we know (unmapped).
Classified classify(const std::string& name);
// Our parameter name of a slot inside blocks.<i>. ("moe.experts.w1+w3" for the fused gate_up).
const char* slot_name(Slot s);

}  // namespace moe::io::hf
