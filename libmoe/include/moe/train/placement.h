// Expert placement while training (issue 17; moe-train --placement): the policies that decide,
// for each MoE layer and micro-batch, which ranks of the expert-parallel group compute which
// expert's rows, so that no rank is the straggler holding the hot experts.
//
//   static   plain expert parallelism: rank p holds and computes experts [p E/P, (p+1) E/P)
//            (no policy object; the model is built sharded).
//   lpt      ES-MoE's per-batch placement: every expert of the batch to one rank by Graham's LPT
//            over its tokens in the whole group (balance::lpt_batch_placement), no per-rank cap.
//   flexmoe  FlexMoE's vExperts: each rank has V slots per layer, each a replica of one expert;
//            tokens go to replicas by flexible routing (balance::flexible_route, Alg. 3), and every
//            --replan-every steps the greedy policy maker (balance::make_plan) expands, shrinks
//            and migrates replicas by the cost model while the balance ratio is above threshold.
//
//   lpt:     every rank stores every expert ([E, ...] tensors) and the trainer sums the expert
//            gradients over the world like dense ones, so every rank keeps every expert current
//            (ES-MoE's ranks share one host store; an expert can go to any rank next batch).
//   flexmoe: a rank stores its V vExpert slots ([V, ...] tensors, held_rows()). An expert's
//            gradient sums over its holders (parallel::GradSync::set_expert_holders, ascending
//            expert id), Expand copies the parameters and Adam state from a holder into the new
//            slot (move_experts), Shrink and Migrate free a slot, and a checkpoint gathers every
//            logical expert from its first holder (gather_experts). The model computed is the
//            static one's, up to float summation order.
//
// Every rank calls place() in the same order (once per MoE layer and pass; it all-gathers the
// group's token counts) and computes the same assignment from the same integers.
//
// Shape letters: P ranks of the expert group, E experts of a layer, V vExpert slots per rank.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "moe/balance/flexmoe.h"
#include "moe/comm/communicator.h"
#include "moe/nn/placement.h"
#include "moe/optim/adamw.h"
#include "moe/param.h"

namespace moe::train {

// Which ranks compute which experts (the placement setting; see the top of this file).
// fixed is the name "static" (as in plan::Placement).
enum class PlacementRule { fixed, lpt, flexmoe };
const char* placement_rule_name(PlacementRule policy);  // "static" | "lpt" | "flexmoe"
// Throws UsageError naming the setting's flag and listing its values for any other name.
PlacementRule parse_placement_rule(std::string_view name);

struct PlacementConfig {
  PlacementRule policy = PlacementRule::fixed;
  int64_t vexperts_per_rank = 0;   // flexmoe: V slots per rank and layer (0: ceil(E/P) + 1)
  double balance_threshold = 1.1;  // flexmoe: replan while max/mean rank tokens is above this
  int64_t replan_every = 10;       // flexmoe: optimizer steps between replans
};
// UsageError naming the flag for a value out of range.
void check_placement_config(const PlacementConfig& config);

// What one replan did to one MoE layer (logged by moe-train and written to its metrics).
struct Replan {
  int64_t block = 0;
  std::vector<balance::PlanAction> actions;
  double predicted_before_s = 0, predicted_after_s = 0;  // the cost model's step of the layer
  double balance_before = 0, balance_after = 0;          // max/mean rank tokens (eq. 6)
  double adjustment_s = 0;                               // the actions' predicted copy time
  // Filled by the trainer once the replicas moved: the state copies made (a replica added and
  // dropped within the plan is not copied) and this rank's seconds in them.
  int64_t copies = 0;
  double measured_adjustment_s = 0;
  std::vector<int32_t> slots_before;  // the layer's map before (its slots)
};
std::string describe(const Replan& replan);  // one line: what moved, predicted times
nlohmann::json to_json(const Replan& replan);

class TrainingPlacement : public nn::PlacementPolicy {
 public:
  // A policy over `group` (the expert-parallel ranks; it must outlive the policy) for the MoE
  // blocks `experts` (block index -> its experts). Null for "static".
  static std::unique_ptr<TrainingPlacement> make(const PlacementConfig& config,
                                                 comm::Communicator& group,
                                                 const std::map<int64_t, int64_t>& experts);

  // All-gathers this rank's kept rows per expert over the group (collective), then assigns.
  nn::ExpertAssignment place(int64_t block, const Tensor& topk_idx,
                             const std::vector<int32_t>& tokens_per_expert) final;
  // A forward pass (micro-batch) starts: the first place() of each layer in it adds its token
  // counts to the step's (a recomputed block places again with the same counts, not counted).
  void begin_pass() { seen_.clear(); }
  // The optimizer step `step` (steps done, counting it) ended; the step's token counts are then
  // dropped. flexmoe replans here every --replan-every steps, with cost().
  virtual std::vector<Replan> end_step(int64_t step);
  // flexmoe's cost model: the start-up profile, or the one saved with the checkpoint resumed
  // (so a resumed run makes the plans the uninterrupted one would).
  void set_cost(const balance::CostModel& cost) { cost_ = cost; }
  const balance::CostModel& cost() const { return cost_; }
  // The placement's state for a checkpoint (null when it has none) and its restore, which
  // returns a note when the state does not fit this run (another P or V): it then starts afresh.
  virtual nlohmann::json state() const { return nullptr; }
  virtual std::string load_state(const nlohmann::json&) { return {}; }

  const PlacementConfig& config() const { return config_; }
  // flexmoe: the cost model's prediction of each MoE block's time in the step end_step() last
  // closed (its tokens under the map they were routed with), seconds; empty for lpt.
  const std::map<int64_t, double>& predicted_s() const { return predicted_s_; }

 protected:
  TrainingPlacement(const PlacementConfig& config, comm::Communicator& group)
      : config_(config), group_(group) {}
  // The assignment of one layer's rows from the whole group's counts tokens[s][e].
  virtual nn::ExpertAssignment assign(int64_t block, const balance::TokenMatrix& tokens) = 0;

  PlacementConfig config_;
  comm::Communicator& group_;
  std::map<int64_t, balance::TokenMatrix> step_tokens_;  // per MoE block, summed over passes
  balance::CostModel cost_;
  std::map<int64_t, double> predicted_s_;

 private:
  std::set<int64_t> seen_;  // blocks placed in this pass
};

// ES-MoE's per-batch LPT (see above).
class LptPlacement final : public TrainingPlacement {
 public:
  LptPlacement(const PlacementConfig& config, comm::Communicator& group)
      : TrainingPlacement(config, group) {}

 private:
  nn::ExpertAssignment assign(int64_t block, const balance::TokenMatrix& tokens) override;
};

// FlexMoE's vExperts (see above).
class FlexMoEPlacement final : public TrainingPlacement {
 public:
  // Every MoE block's map starts as plain expert parallelism in vExpert form
  // (balance::VExpertMap::contiguous); UsageError when V slots per rank cannot hold a layer.
  FlexMoEPlacement(const PlacementConfig& config, comm::Communicator& group,
                   const std::map<int64_t, int64_t>& experts);
  std::vector<Replan> end_step(int64_t step) override;
  std::vector<int64_t> held_rows(int64_t block, int64_t experts) const override;
  nlohmann::json state() const override;
  std::string load_state(const nlohmann::json& state) override;
  const std::map<int64_t, balance::VExpertMap>& maps() const { return maps_; }

 private:
  nn::ExpertAssignment assign(int64_t block, const balance::TokenMatrix& tokens) override;
  balance::VExpertMap& map_of(int64_t block, int64_t experts);
  balance::VExpertMap initial_map(int64_t block, int64_t experts) const;
  std::map<int64_t, balance::VExpertMap> maps_;
};

// The expert tensors of MoE block `block` ("blocks.B.moe.experts.*", in ParamSet order).
std::vector<Param*> expert_params(ParamSet& params, int64_t block);

// The slot (row of its expert tensors) holding `expert` on `rank`, -1 when it holds none; and a
// rank's slots as held_rows gives them.
int32_t slot_of(const balance::VExpertMap& map, int rank, int64_t expert);
std::vector<int64_t> slot_experts(const balance::VExpertMap& map, int rank);

// One replica's state to copy at a replan: expert `expert` from row `from_row` of rank `from`'s
// expert tensors to row `to_row` of rank `to`'s.
struct ExpertMove {
  int64_t expert;
  int from, from_row, to, to_row;
};
// The copies that take map `before` to `after`: one per replica `after` holds and `before` did
// not, from a rank holding the expert in `before` (the planned source of its Expand when that is
// one, else the lowest), in expert then rank order.
std::vector<ExpertMove> plan_moves(const balance::VExpertMap& before,
                                   const balance::VExpertMap& after,
                                   const std::vector<balance::PlanAction>& actions);
// Runs `moves` for `params` (values, fp32 masters, Adam m and v) over `group`: every source row
// is sent before any row is written (a slot freed and refilled by one plan is read first), then
// the receivers copy into their slots and refresh the compute copies. Collective for the ranks
// named in moves; every rank passes the same list.
void move_experts(comm::Communicator& group, const std::vector<Param*>& params,
                  const optim::AdamW& optimizer, const std::vector<ExpertMove>& moves);
// The logical [E, ...] tensor of a slot tensor ([V, ...] on every rank, rows by `map`), each
// expert from its first holder, on `root` (undefined elsewhere). Collective over `group`.
Tensor gather_experts(comm::Communicator& group, const Tensor& slots,
                      const balance::VExpertMap& map, int root);
// This rank's slot rows of a logical [E, ...] tensor (zeros for an empty slot).
Tensor take_slots(const Tensor& logical, const std::vector<int64_t>& slot_experts);

}  // namespace moe::train
