// gpt flavour (GPT-2 / Switch Transformer style): learned positions, pre-LayerNorm, GELU (tanh),
// biases everywhere, LM head tied to the token embedding, attention scale 1/sqrt(head_dim).
#include "moe/models/flavour.h"

namespace moe {

Flavour gpt_flavour(const ModelConfig&) {
  Flavour f;
  f.norm = nn::NormKind::layernorm;
  f.activation = nn::Activation::gelu;
  f.bias = true;
  f.learned_positions = true;
  f.tied_head = true;
  f.normalize_topk = false;
  return f;
}

namespace {

Flavour family_flavour(const ModelConfig& config) {
  switch (config.arch) {
    case Arch::gpt:
      return gpt_flavour(config);
    case Arch::mixtral:
      return mixtral_flavour(config);
    case Arch::qwen2_moe:
      return qwen2_moe_flavour(config);
    case Arch::qwen3_moe:
      return qwen3_moe_flavour(config);
    case Arch::olmoe:
      return olmoe_flavour(config);
    case Arch::glm4_moe:
      return glm4_moe_flavour(config);
    case Arch::deepseek_v3:
      return deepseek_v3_flavour(config);
    case Arch::gpt_oss:
      return gpt_oss_flavour(config);
  }
  return mixtral_flavour(config);
}

}  // namespace

Flavour flavour_of(const ModelConfig& config) {
  Flavour f = family_flavour(config);
  f.tied_head = f.tied_head || config.tie_embeddings;  // tie_word_embeddings in any family
  return f;
}

}  // namespace moe
