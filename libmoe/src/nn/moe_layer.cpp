// MoE layer forward/backward (see moe/nn/moe_layer.h).
// Shapes: N tokens, D model width, E experts, k experts per token, M kept assignments.
#include "moe/nn/moe_layer.h"

#include "moe/ops/core.h"

namespace moe::nn {

const MoEConfig& MoELayer::checked(const std::string& prefix, const MoEConfig& config) {
  MOE_USAGE_CHECK(config.router.num_experts == config.experts.num_experts, "moe layer ", prefix,
                  ": router has ", config.router.num_experts, " experts but experts has ",
                  config.experts.num_experts);
  MOE_USAGE_CHECK(config.router.d_model == config.experts.d_model, "moe layer ", prefix,
                  ": router d_model ", config.router.d_model, " differs from experts d_model ",
                  config.experts.d_model);
  return config;
}

MoELayer::MoELayer(ParamSet& ps, const std::string& prefix, const MoEConfig& config)
    : config_(checked(prefix, config)),
      router_(ps, prefix + ".router", config.router),
      experts_(ps, prefix + ".experts", config.experts) {}

Tensor MoELayer::forward(const Tensor& x, const RouterStep& step, Saved* saved,
                         MoEStats* stats) const {
  RouterOutput routed = router_.forward(x, step);
  Tensor x_perm = dispatch(x, routed.plan);
  Tensor y_perm =
      experts_.forward(x_perm, routed.plan.expert_offsets, saved ? &saved->experts : nullptr);
  Tensor y = combine(y_perm, routed.plan);
  if (stats) {
    stats->aux_loss = routed.aux_loss;
    stats->z_loss = routed.z_loss;
    stats->load = routed.load;
    stats->tokens_per_expert = routed.plan.tokens_per_expert;
    stats->assignments = routed.plan.num_tokens * routed.plan.top_k;
    stats->dropped = routed.plan.dropped();
  }
  if (saved) {
    saved->x = x;
    saved->router = std::move(routed);
    saved->x_perm = x_perm;
    saved->y_perm = y_perm;
  }
  return y;
}

Tensor MoELayer::backward(const Tensor& dy, const Saved& saved, float aux_scale, float z_scale) {
  const DispatchPlan& plan = saved.router.plan;
  MOE_CHECK(saved.x.defined() && saved.y_perm.defined(), "moe layer ", router_.weight().name,
            ": backward without a saved forward");
  dy.expect_shape(saved.x.shape(), "moe layer backward dy");
  Tensor dy_perm, dweight_of_slot;
  combine_backward(dy, saved.y_perm, plan, dy_perm, dweight_of_slot);
  Tensor dx_perm = experts_.backward(dy_perm, saved.experts);
  Tensor dx = dispatch_backward(dx_perm, plan);
  Tensor dx_router = router_.backward(dweight_of_slot, saved.router, saved.x, aux_scale, z_scale);
  ops::axpy(1.0f, dx_router, dx);
  return dx;
}

}  // namespace moe::nn
