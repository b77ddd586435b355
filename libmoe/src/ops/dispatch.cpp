// Dispatch/combine ops: the routing table (token -> slot mapping, no one-hot, no padding), built
// on the host, and the operand checks of the row gather / combine, whose loops are Backend::moe.
// Shapes: N tokens, D model width, E experts, k experts per token, M kept assignments (slots).
#include <algorithm>

#include "core/backend.h"
#include "moe/ops/core.h"
#include "moe/ops/moe.h"
#include "moe/step_breakdown.h"

namespace moe::ops {
namespace {

// The routing algorithm on host tensors (checks the ids, then builds the table), shared by the CPU
// op and the CUDA path.
DispatchPlan build_routing_on_host(const Tensor& topk_idx, const Tensor& topk_weight,
                                   int64_t num_experts, int64_t capacity) {
  const int64_t tokens = topk_idx.dim(0), k = topk_idx.dim(1);
  const int32_t* idx = topk_idx.data<int32_t>();
  const float* weight = topk_weight.data<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = idx[t * k + j];
      MOE_CHECK(e >= 0 && e < num_experts, "make_plan: expert id ", e, " of token ", t, " choice ",
                j, " in ", topk_idx.describe(), " outside [0, ", num_experts, ")");
      for (int64_t i = 0; i < j; ++i)
        MOE_CHECK(idx[t * k + i] != e, "make_plan: token ", t, " chooses expert ", e, " twice in ",
                  topk_idx.describe());
    }
  }

  DispatchPlan table;
  table.num_tokens = tokens;
  table.top_k = k;
  table.num_experts = num_experts;
  table.capacity = capacity;
  const size_t E = static_cast<size_t>(num_experts);
  table.load.assign(E, 0);
  // Position of each assignment inside its expert, in priority order (choice j, then token t).
  std::vector<int64_t> position(static_cast<size_t>(tokens * k));
  for (int64_t j = 0; j < k; ++j)
    for (int64_t t = 0; t < tokens; ++t) {
      int32_t e = idx[t * k + j];
      position[t * k + j] = table.load[e]++;
    }
  table.tokens_per_expert.assign(E, 0);
  table.expert_offsets.assign(E + 1, 0);
  for (size_t e = 0; e < E; ++e) {
    int64_t kept = capacity > 0 ? std::min(table.load[e], capacity) : table.load[e];
    table.tokens_per_expert[e] = static_cast<int32_t>(kept);
    table.expert_offsets[e + 1] = table.expert_offsets[e] + static_cast<int32_t>(kept);
  }
  const int64_t slots = table.expert_offsets[E];
  table.slot_of = Tensor::empty({tokens * k}, DType::i32).set_name("plan.slot_of");
  table.token_of_slot = Tensor::empty({slots}, DType::i32).set_name("plan.token_of_slot");
  table.weight_of_slot = Tensor::empty({slots}, DType::f32).set_name("plan.weight_of_slot");
  int32_t* slot_of = table.slot_of.data<int32_t>();
  int32_t* token_of_slot = table.token_of_slot.data<int32_t>();
  float* weight_of_slot = table.weight_of_slot.data<float>();
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      int64_t a = t * k + j;
      int32_t e = idx[a];
      if (capacity > 0 && position[a] >= capacity) {
        slot_of[a] = -1;
        continue;
      }
      int32_t s = table.expert_offsets[e] + static_cast<int32_t>(position[a]);
      slot_of[a] = s;
      token_of_slot[s] = static_cast<int32_t>(t);
      weight_of_slot[s] = weight[a];
    }
  return table;
}

}  // namespace

int64_t DispatchPlan::num_slots() const {
  return expert_offsets.empty() ? 0 : static_cast<int64_t>(expert_offsets.back());
}

int64_t DispatchPlan::dropped() const { return num_tokens * top_k - num_slots(); }

DispatchPlan build_routing(const Tensor& topk_idx, const Tensor& topk_weight, int64_t num_experts,
                           int64_t capacity) {
  const PartScope part(StepPart::dispatch);
  const Device device = require_backend("make_plan", {&topk_idx, &topk_weight});
  MOE_CHECK(topk_idx.ndim() == 2, "make_plan: [N,k] expert ids expected, got ",
            topk_idx.describe());
  topk_idx.expect_dtype(DType::i32, "make_plan topk_idx");
  topk_weight.expect_shape(topk_idx.shape(), "make_plan topk_weight");
  topk_weight.expect_dtype(DType::f32, "make_plan topk_weight");
  const int64_t tokens = topk_idx.dim(0), k = topk_idx.dim(1);
  MOE_CHECK(num_experts >= 1, "make_plan: num_experts must be positive, got ", num_experts);
  MOE_CHECK(k >= 1 && k <= num_experts, "make_plan: top_k ", k, " of ", topk_idx.describe(),
            " must be in [1, num_experts = ", num_experts, "]");
  MOE_CHECK(capacity >= 0, "make_plan: capacity ", capacity, " is negative");
  MOE_CHECK(tokens * k < (int64_t(1) << 31), "make_plan: ", topk_idx.describe(),
            " has too many assignments for 32-bit slot ids");
  if (device.kind != Device::cpu) {
    // The table is built on the host: one device-to-host copy of the N*k ids and weights per
    // layer, then slot_of / token_of_slot / weight_of_slot go back to the ids' device.
    DispatchPlan table = build_routing_on_host(topk_idx.to(Device{}), topk_weight.to(Device{}),
                                               num_experts, capacity);
    table.slot_of = table.slot_of.to(device);
    table.token_of_slot = table.token_of_slot.to(device);
    table.weight_of_slot = table.weight_of_slot.to(device);
    return table;
  }
  return build_routing_on_host(topk_idx, topk_weight, num_experts, capacity);
}

void gather_rows(const Tensor& x, const Tensor& token_of_slot, Tensor& x_perm) {
  const PartScope part(StepPart::dispatch);
  const Device device = require_backend("dispatch", {&x, &token_of_slot, &x_perm});
  x.expect_dtype(DType::f32, "dispatch x");
  MOE_CHECK(x.ndim() == 2, "dispatch: [N,D] input expected, got ", x.describe());
  token_of_slot.expect_dtype(DType::i32, "dispatch token_of_slot");
  const int64_t width = x.dim(1), slots = token_of_slot.numel();
  x_perm.expect_shape({slots, width}, "dispatch x_perm");
  backend_for(device).moe.gather_rows(x, token_of_slot, x_perm);
}

void combine_rows(const Tensor& rows, const Tensor& slot_of, const Tensor& weight_of_slot,
                  int64_t top_k, Tensor& y) {
  const PartScope part(StepPart::dispatch);
  const Device device = require_backend("combine", {&rows, &slot_of, &weight_of_slot, &y});
  rows.expect_dtype(DType::f32, "combine rows");
  MOE_CHECK(rows.ndim() == 2, "combine: [M,D] rows expected, got ", rows.describe());
  slot_of.expect_dtype(DType::i32, "combine slot_of");
  MOE_CHECK(top_k >= 1 && slot_of.numel() % top_k == 0, "combine: ", slot_of.describe(),
            " is not [N*k] for k = ", top_k);
  const int64_t slots = rows.dim(0), width = rows.dim(1), tokens = slot_of.numel() / top_k;
  y.expect_shape({tokens, width}, "combine y");
  if (weight_of_slot.defined()) weight_of_slot.expect_shape({slots}, "combine weight_of_slot");
  backend_for(device).moe.combine_rows(rows, slot_of, weight_of_slot, top_k, y);
}

void combine_rows_backward(const Tensor& dy, const Tensor& y_perm, const Tensor& token_of_slot,
                           const Tensor& weight_of_slot, Tensor& dy_perm, Tensor& dweight_of_slot) {
  const PartScope part(StepPart::dispatch);
  const Device device =
      require_backend("combine_backward",
                      {&dy, &y_perm, &token_of_slot, &weight_of_slot, &dy_perm, &dweight_of_slot});
  dy.expect_dtype(DType::f32, "combine_backward dy");
  MOE_CHECK(dy.ndim() == 2, "combine_backward: [N,D] gradient expected, got ", dy.describe());
  const int64_t width = dy.dim(1), slots = token_of_slot.numel();
  y_perm.expect_shape({slots, width}, "combine_backward y_perm");
  token_of_slot.expect_dtype(DType::i32, "combine_backward token_of_slot");
  weight_of_slot.expect_shape({slots}, "combine_backward weight_of_slot");
  dy_perm.expect_shape({slots, width}, "combine_backward dy_perm");
  dweight_of_slot.expect_shape({slots}, "combine_backward dweight_of_slot");
  backend_for(device).moe.combine_rows_backward(dy, y_perm, token_of_slot, weight_of_slot, dy_perm,
                                                dweight_of_slot);
}

void slot_to_choice(const Tensor& dweight_of_slot, const Tensor& slot_of, Tensor& dtopk_weight) {
  const PartScope part(StepPart::dispatch);
  const Device device =
      require_backend("slot_to_choice", {&dweight_of_slot, &slot_of, &dtopk_weight});
  dweight_of_slot.expect_dtype(DType::f32, "slot_to_choice dweight_of_slot");
  slot_of.expect_dtype(DType::i32, "slot_to_choice slot_of");
  dtopk_weight.expect_dtype(DType::f32, "slot_to_choice dtopk_weight");
  MOE_CHECK(dtopk_weight.numel() == slot_of.numel(), "slot_to_choice: ", dtopk_weight.describe(),
            " vs ", slot_of.describe());
  backend_for(device).moe.slot_to_choice(dweight_of_slot, slot_of, dtopk_weight);
}

}  // namespace moe::ops
