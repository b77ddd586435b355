// Dispatch plan construction and dispatch/combine (see moe/nn/dispatch.h).
// Shapes: N tokens, D model width, E experts, k experts per token, M kept assignments (slots).
#include "moe/nn/dispatch.h"

#include "moe/ops/moe.h"

namespace moe::nn {

DispatchPlan make_plan(const Tensor& topk_idx, const Tensor& topk_weight, int64_t num_experts,
                       int64_t capacity) {
  return ops::build_routing(topk_idx, topk_weight, num_experts, capacity);
}

namespace {
void check_plan(const char* op, const DispatchPlan& plan) {
  MOE_CHECK(plan.top_k >= 1 && plan.slot_of.defined() && plan.token_of_slot.defined() &&
                plan.slot_of.numel() == plan.num_tokens * plan.top_k &&
                plan.token_of_slot.numel() == plan.num_slots(),
            op, ": the dispatch plan is empty or inconsistent (", plan.num_tokens, " tokens, k ",
            plan.top_k, ", ", plan.num_slots(), " slots)");
}
}  // namespace

Tensor dispatch(const Tensor& x, const DispatchPlan& plan) {
  check_plan("dispatch", plan);
  MOE_CHECK(x.ndim() == 2 && x.dim(0) == plan.num_tokens, "dispatch: ", x.describe(),
            " does not match a plan for ", plan.num_tokens, " tokens");
  Tensor x_perm =
      Tensor::empty({plan.num_slots(), x.dim(1)}, DType::f32, x.device()).set_name("moe.x_perm");
  ops::gather_rows(x, plan.token_of_slot, x_perm);
  return x_perm;
}

Tensor dispatch_backward(const Tensor& dx_perm, const DispatchPlan& plan) {
  check_plan("dispatch_backward", plan);
  MOE_CHECK(dx_perm.ndim() == 2 && dx_perm.dim(0) == plan.num_slots(),
            "dispatch_backward: ", dx_perm.describe(), " does not match a plan with ",
            plan.num_slots(), " slots");
  Tensor dx = Tensor::empty({plan.num_tokens, dx_perm.dim(1)}, DType::f32, dx_perm.device())
                  .set_name("moe.dx");
  ops::combine_rows(dx_perm, plan.slot_of, Tensor(), plan.top_k, dx);
  return dx;
}

Tensor combine(const Tensor& y_perm, const DispatchPlan& plan) {
  check_plan("combine", plan);
  MOE_CHECK(y_perm.ndim() == 2 && y_perm.dim(0) == plan.num_slots(), "combine: ", y_perm.describe(),
            " does not match a plan with ", plan.num_slots(), " slots");
  Tensor y = Tensor::empty({plan.num_tokens, y_perm.dim(1)}, DType::f32, y_perm.device())
                 .set_name("moe.y");
  ops::combine_rows(y_perm, plan.slot_of, plan.weight_of_slot, plan.top_k, y);
  return y;
}

void combine_backward(const Tensor& dy, const Tensor& y_perm, const DispatchPlan& plan,
                      Tensor& dy_perm, Tensor& dweight_of_slot) {
  check_plan("combine_backward", plan);
  MOE_CHECK(dy.ndim() == 2 && dy.dim(0) == plan.num_tokens, "combine_backward: ", dy.describe(),
            " does not match a plan for ", plan.num_tokens, " tokens");
  const Shape perm_shape{plan.num_slots(), dy.dim(1)};
  if (!dy_perm.defined() || dy_perm.shape() != perm_shape || dy_perm.dtype() != DType::f32)
    dy_perm = Tensor::empty(perm_shape, DType::f32, dy.device()).set_name("moe.dy_perm");
  if (!dweight_of_slot.defined() || dweight_of_slot.shape() != Shape{plan.num_slots()} ||
      dweight_of_slot.dtype() != DType::f32)
    dweight_of_slot =
        Tensor::empty({plan.num_slots()}, DType::f32, dy.device()).set_name("moe.dweight_of_slot");
  ops::combine_rows_backward(dy, y_perm, plan.token_of_slot, plan.weight_of_slot, dy_perm,
                             dweight_of_slot);
}

}  // namespace moe::nn
