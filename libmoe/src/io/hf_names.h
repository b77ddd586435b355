// Hugging Face MoE tensor names (Mixtral, OLMoE, Qwen2/3-MoE) and where each goes in our model:
// which block slot, which expert, or why it cannot be imported. Private to libmoe (used by
// hf_checkpoint.cpp).
#pragma once
#include <cstdint>
#include <string>

namespace moe::io::hf {

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
