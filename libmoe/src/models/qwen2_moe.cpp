// qwen2_moe flavour (HF Qwen2-MoE, Qwen1.5-MoE): mixtral's layers plus biases on the q, k and v
// projections (none on o), and a shared expert in every MoE layer whose output is scaled by a
// per-token sigmoid gate before it is added to the routed experts'. Top-k gates are not
// renormalised by default (norm_topk_prob false).
#include "moe/models/flavour.h"

namespace moe {

Flavour qwen2_moe_flavour(const ModelConfig& config) {
  Flavour f = mixtral_flavour(config);
  f.qkv_bias = true;
  f.shared_expert_gate = true;
  f.normalize_topk = false;
  return f;
}

}  // namespace moe
