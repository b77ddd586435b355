// qwen3_moe flavour (HF Qwen3-MoE): mixtral's layers plus a per-head RMSNorm of the queries and
// keys before RoPE (one weight of head_dim shared by all heads), no attention biases, no shared
// expert; the released models renormalise the top-k gates (norm_topk_prob true).
#include "moe/models/flavour.h"

namespace moe {

Flavour qwen3_moe_flavour(const ModelConfig& config) {
  Flavour f = mixtral_flavour(config);
  f.qk_norm = nn::QkNorm::head;
  f.normalize_topk = true;
  return f;
}

}  // namespace moe
