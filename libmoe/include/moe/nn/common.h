// Choices shared by several layers.
#pragma once
#include "moe/op_types.h"

namespace moe::nn {

enum class NormKind { layernorm, rmsnorm };
// RMSNorm of the queries and keys before RoPE: none, per head (Qwen3-MoE: one weight [hd] shared by
// the heads) or over the whole projection (OLMoE: weights [H*hd] and [KV*hd]).
enum class QkNorm { none, head, full };
// How a router turns logits into scores: softmax over all experts (Switch, Mixtral, Qwen, OLMoE)
// or an independent sigmoid per expert (DeepSeek-V3; top-k may add a per-expert selection bias).
enum class RouterScoring { softmax, sigmoid };
// The activation of dense and expert FFNs; the ops take it too, so it lives in core.
using moe::Activation;

}  // namespace moe::nn
