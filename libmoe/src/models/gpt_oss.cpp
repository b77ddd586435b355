// gpt_oss flavour (HF GptOss, OpenAI gpt-oss-20b / -120b): mixtral's layers (RMSNorm, RoPE on
// halves, grouped-query attention, untied head) with biases on q, k, v and o and on every expert's
// projections (b1, b3, b2), a learned sink logit a head in each attention softmax (attn.sinks),
// the clamped SwiGLU (ModelConfig::swiglu_alpha, swiglu_limit), and a router whose logits carry a
// trained bias (moe.router.logit_bias) with the gate weights a softmax over the chosen experts'
// logits (= ours over all experts, renormalised over the top-k). Sliding windows on alternating
// layers and YaRN are ModelConfig's (window_layers, rope_type) as in the other families.
#include "moe/models/flavour.h"

namespace moe {

Flavour gpt_oss_flavour(const ModelConfig& config) {
  Flavour f = mixtral_flavour(config);
  f.bias = true;
  f.activation = nn::Activation::swiglu_clamped;
  f.normalize_topk = true;
  f.router_logit_bias = true;
  f.sinks = true;
  return f;
}

}  // namespace moe
