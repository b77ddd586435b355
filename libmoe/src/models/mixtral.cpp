// mixtral flavour (HF Mixtral): RMSNorm, RoPE (rotate halves), grouped-query attention, SwiGLU
// experts, router softmax over all experts then top-k then renormalise, no biases, untied head.
#include "moe/models/flavour.h"

namespace moe {

Flavour mixtral_flavour(const ModelConfig&) {
  Flavour f;
  f.norm = nn::NormKind::rmsnorm;
  f.activation = nn::Activation::swiglu;
  f.bias = false;
  f.learned_positions = false;
  f.tied_head = false;
  f.normalize_topk = true;
  return f;
}

}  // namespace moe
