// Dispatch plan and the token <-> slot movement of the MoE layer: a dense token -> expert mapping
// table instead of one-hot einsums, no zero padding (DeepSpeed-MoE). The plan is a value returned
// by the router and kept by the caller for backward; no layer stores it on `this`.
// Shapes: N tokens, D model width, E experts, k experts per token, M kept assignments (slots),
// R ranks of the expert-parallel group.
#pragma once
#include <cstdint>
#include <vector>

#include "moe/ops/moe.h"
#include "moe/tensor.h"

namespace moe::nn {

// The plan's fields and their shapes: ops::DispatchPlan (moe/ops/moe.h), one type for the op and
// the layer.
using DispatchPlan = ops::DispatchPlan;

// Slots are in expert order; inside one expert, in priority order: all tokens' 1st choices in
// token order, then all 2nd choices, ... (GShard). capacity 0 = dropless; otherwise at most
// `capacity` slots per expert (the router uses C = ceil(capacity_factor * N * k / E)).
// Throws moe::Error when k > E, an expert id is out of range or a token picks one expert twice.
DispatchPlan make_plan(const Tensor& topk_idx /*[N,k] i32*/,
                       const Tensor& topk_weight /*[N,k] f32*/, int64_t num_experts,
                       int64_t capacity);

// X_perm [M,D]: rows of x gathered in slot order.
Tensor dispatch(const Tensor& x /*[N,D]*/, const DispatchPlan& plan);
// [N,D]: per-token sum of its kept slots' rows, in choice order (deterministic).
Tensor dispatch_backward(const Tensor& dx_perm /*[M,D]*/, const DispatchPlan& plan);
// y[t] = sum over kept choices j (in order) of w * Y_perm[slot]; tokens with every choice dropped
// get 0.
Tensor combine(const Tensor& y_perm /*[M,D]*/, const DispatchPlan& plan);
// dy_perm [M,D] = w * dy[token of slot]; dweight_of_slot [M] = <dy[token], Y_perm[slot]>.
// Outputs are (re)allocated unless they already have the right shape.
void combine_backward(const Tensor& dy /*[N,D]*/, const Tensor& y_perm, const DispatchPlan& plan,
                      Tensor& dy_perm /*out [M,D]*/, Tensor& dweight_of_slot /*out [M]*/);

}  // namespace moe::nn
