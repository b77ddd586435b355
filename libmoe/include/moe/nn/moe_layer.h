// The MoE layer: Router -> DispatchPlan -> dispatch -> Experts (grouped GEMM) -> combine, and its
// backward. Tokens whose every choice was dropped by capacity get 0 (the block's residual carries
// them). The plan and every activation backward needs travel in Saved, never on `this`.
// Shapes: N tokens, D model width, F expert hidden width, E experts, k experts per token,
// M kept assignments.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moe/nn/experts.h"
#include "moe/nn/router.h"

namespace moe::nn {

struct MoEConfig {
  RouterConfig router;  // router.num_experts == experts.num_experts, d_model equal
  ExpertsConfig experts;
};

struct MoEStats {
  double aux_loss = 0, z_loss = 0;
  std::vector<int64_t> load;               // [E] before capacity
  std::vector<int32_t> tokens_per_expert;  // [E] kept
  int64_t assignments = 0, dropped = 0;    // N*k and dropped by capacity
};

// prefix e.g. "blocks.1.moe": router at prefix + ".router", experts at prefix + ".experts"
class MoELayer {
 public:
  MoELayer(ParamSet& ps, const std::string& prefix, const MoEConfig& config);

  struct Saved {
    Tensor x;             // [N,D]
    RouterOutput router;  // plan, probs, choices, jitter noise
    Tensor x_perm;        // [M,D]
    Experts::Saved experts;
    Tensor y_perm;  // [M,D]
  };

  // [N,D]; saved and stats may be null.
  Tensor forward(const Tensor& x, const RouterStep& step, Saved* saved, MoEStats* stats) const;
  // Returns dx [N,D]; accumulates (+=) into the router's and experts' parameter gradients.
  Tensor backward(const Tensor& dy, const Saved& saved, float aux_scale, float z_scale);

  const MoEConfig& config() const { return config_; }
  Router& router() { return router_; }
  const Router& router() const { return router_; }
  Experts& experts() { return experts_; }
  const Experts& experts() const { return experts_; }

 private:
  static const MoEConfig& checked(const std::string& prefix, const MoEConfig& config);
  MoEConfig config_;
  Router router_;
  Experts experts_;
};

}  // namespace moe::nn
