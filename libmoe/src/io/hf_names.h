// Hugging Face MoE checkpoint names: the files of a checkpoint directory, and the tensor names
// (Mixtral, OLMoE, Qwen2/3-MoE) with where each goes in our model: which block slot, which expert,
// or why it cannot be imported. Private to libmoe (hf_checkpoint.cpp, hf_export.cpp).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

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

enum class Slot { norm1, norm2, q, k, v, o, router, w1, w2, w3, gate_up, down };

struct Classified {
  enum Kind { mapped, derived, unsupported, unmapped } kind = unmapped;
  std::string our;  // embed.tokens, final_norm.weight, lm_head.weight, or "" for layer slots
  int64_t layer = -1, expert = -1;
  Slot slot = Slot::norm1;
  std::string feature;  // unsupported: what
};

// What `name` is: one of our outer tensors (embed.tokens, final_norm.weight, lm_head.weight), a
// block slot (layer, and expert for per-expert tensors), a tensor derived from the config (RoPE
// frequencies), a feature we lack (feature says which), or nothing we know (unmapped).
Classified classify(const std::string& name);
// Our parameter name of a slot inside blocks.<i>. ("moe.experts.w1+w3" for the fused gate_up).
const char* slot_name(Slot s);

}  // namespace moe::io::hf
