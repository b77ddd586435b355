// olmoe flavour (HF OLMoE): mixtral's layers plus an RMSNorm of the whole query projection
// ([H*hd]) and of the whole key projection ([KV*hd]) before RoPE; top-k gates are not
// renormalised (norm_topk_prob false).
#include "moe/models/flavour.h"

namespace moe {

Flavour olmoe_flavour(const ModelConfig& config) {
  Flavour f = mixtral_flavour(config);
  f.qk_norm = nn::QkNorm::full;
  f.normalize_topk = false;
  return f;
}

}  // namespace moe
