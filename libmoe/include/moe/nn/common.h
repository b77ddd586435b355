// Choices shared by several layers.
#pragma once
#include "moe/op_types.h"

namespace moe::nn {

enum class NormKind { layernorm, rmsnorm };
// The activation of dense and expert FFNs; the ops take it too, so it lives in core.
using moe::Activation;

}  // namespace moe::nn
