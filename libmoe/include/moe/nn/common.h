// Choices shared by several layers.
#pragma once

namespace moe::nn {

enum class NormKind { layernorm, rmsnorm };
// gelu: W2 gelu(W1 x + b1) + b2 (gpt);  swiglu: W2 (silu(W1 x) * W3 x) (mixtral)
enum class Activation { gelu, swiglu };

}  // namespace moe::nn
