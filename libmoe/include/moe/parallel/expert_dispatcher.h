// The token exchange of expert parallelism, in Megatron-Core's two phases: dispatch sends each of
// this rank's kept assignments (rows of x_perm, in slot order) to a rank holding its expert and
// hands back the rows that arrived for the experts held here, grouped expert by expert for one
// grouped GEMM; combine sends the experts' output rows back the same way and restores slot order.
// The MoE layer (nn/moe_layer.cpp) routes and runs the experts; this owns every all-to-all-v of
// the exchange (flat or hierarchical, through the scheduler when there is one) and its stats.
// Backward runs the same two phases on the gradients (dispatch dy_perm, combine dx).
//
// Shape letters: P ranks of the expert group, s this rank, E experts of the layer, H the experts
// each rank holds (E/P static, E with a placement policy), M this rank's kept assignments (slots),
// R the rows arriving here, D model width.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moe/balance/placement.h"
#include "moe/comm/all_to_all.h"
#include "moe/comm/communicator.h"
#include "moe/comm/scheduler.h"
#include "moe/parallel/layout.h"
#include "moe/tensor.h"

namespace moe::parallel {

// The movement of one step's rows between ranks, planned by ExpertDispatcher::plan and kept (by
// the layer's Saved) for backward.
struct ExpertExchange {
  std::vector<int64_t> send_counts, recv_counts;  // [P] rows to / from each rank
  std::vector<int64_t> recv_per_expert;           // [P * H], source-major: rows from s for held h
  std::vector<int32_t> local_offsets;             // [H + 1] segments of the regrouped buffer
  std::vector<int32_t> arrival_of;  // [R] regrouped row i is arrival row arrival_of[i]
  // [M] send-buffer row i is x_perm row send_of[i] (rows grouped by destination rank); empty
  // when that is the identity (the static layout: rank p's experts are one run of x_perm).
  std::vector<int32_t> send_of;
  int64_t slots = 0;  // M
};

// The expert group as the dispatcher uses it (the fields of nn::Parallel it reads).
struct ExpertGroup {
  comm::Communicator* experts = nullptr;     // the P ranks
  comm::AllToAllV* exchange = nullptr;       // over `experts` (flat or hierarchical); required
  comm::CommScheduler* scheduler = nullptr;  // when set, the row exchanges go through it
  ExchangeStats* stats = nullptr;            // accumulated when set
};

class ExpertDispatcher {
 public:
  // `layer` names the layer in messages. `placed`: a placement policy decides the ranks, and
  // every rank holds all E experts (H = E); otherwise rank p holds [p H, (p + 1) H).
  ExpertDispatcher(ExpertGroup group, std::string layer, int64_t held_experts, bool placed);

  // Counts and row order of the step's exchange, from this rank's slots (expert_offsets [E+1],
  // tokens_per_expert [E]) and the ranks of each expert. Collective over the group: one
  // all-to-all of [P, H] counts.
  ExpertExchange plan(std::span<const int32_t> expert_offsets,
                      std::span<const int32_t> tokens_per_expert,
                      const balance::ExpertAssignment& assignment) const;
  // rows [M,D] in slot order -> [R,D] the rows for the experts held here, held-expert-major
  // (segments ex.local_offsets). Collective: one all-to-all-v.
  Tensor dispatch(const Tensor& rows, const ExpertExchange& ex) const;
  // local [R,D] in dispatch's order -> [M,D] back on the rows' source ranks, in slot order.
  // Collective: one all-to-all-v.
  Tensor combine(const Tensor& local, const ExpertExchange& ex) const;

 private:
  // All-to-all-v of rows over the expert group (through the scheduler when there is one).
  void exchange(const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
                const std::vector<int64_t>& recv_counts) const;

  ExpertGroup group_;
  std::string layer_;
  int64_t held_ = 0;  // H
  bool placed_ = false;
};

}  // namespace moe::parallel
