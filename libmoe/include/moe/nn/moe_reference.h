// The slow, obviously-correct MoE layer: plain loops over tokens and their chosen experts in fp64,
// reading the same parameters as a MoELayer (by name from the ParamSet). The test oracle of the
// fast path (router + dispatch plan + grouped GEMM + combine); never used for training.
// Shapes: N tokens, D model width, F expert hidden width, E experts, k experts per token.
#pragma once
#include <map>
#include <string>

#include "moe/nn/moe_layer.h"

namespace moe::nn {

struct MoEReferenceResult {
  Tensor y;  // [N,D]
  double aux_loss = 0, z_loss = 0;
  MoEStats stats;
  Tensor dx;                            // [N,D], when dy was given
  std::map<std::string, Tensor> grads;  // parameter name -> d loss / d parameter, when dy was given
};

// Forward of the layer at `prefix` (parameters prefix.router.weight (and .bias), prefix.experts.w1,
// ..., prefix.shared.w1, ..., prefix.shared_gate.weight) and,
// when dy is defined, the gradients of  loss = <dy, y> + aux_scale * aux_loss + z_scale * z_loss
// with respect to x and every parameter of the layer (not accumulated anywhere).
MoEReferenceResult moe_reference(const ParamSet& ps, const std::string& prefix,
                                 const MoEConfig& config, const Tensor& x, const RouterStep& step,
                                 const Tensor& dy = Tensor(), float aux_scale = 0.0f,
                                 float z_scale = 0.0f);

}  // namespace moe::nn
