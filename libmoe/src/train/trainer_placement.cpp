// Trainer's side of --placement flexmoe (FlexMoE's replicas): the gradient sync told each
// expert's holders, replans applied by moving experts' state, and the logical experts gathered
// for checkpoints. The policy itself is train/placement.cpp; the plans are balance/flexmoe.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "moe/timer.h"
#include "moe/train/trainer.h"

namespace moe::train {

const std::map<int64_t, balance::VExpertMap>* Trainer::vexpert_maps() const {
  const auto* flex = dynamic_cast<const FlexMoEPlacement*>(placement_.get());
  return flex ? &flex->maps() : nullptr;
}

// Tells the gradient sync each expert's holders and this rank's slot of it (collective: the same
// maps on every rank).
void Trainer::sync_holders() {
  const auto* maps = vexpert_maps();
  if (!maps) return;
  const int me = layout_->experts()->rank();
  for (const auto& [block, map] : *maps) {
    std::vector<std::vector<int32_t>> holders;
    std::vector<int32_t> rows;
    for (int64_t e = 0; e < map.experts(); ++e) {
      holders.push_back(map.holders(e));
      rows.push_back(slot_of(map, me, e));
    }
    grad_sync_->set_expert_holders(expert_params(*params_, block), holders, rows);
  }
}

// Every replica a plan adds gets the expert's parameters and Adam state from a rank that held it
// before the plan (move_experts); Shrink and Migrate only free slots.
void Trainer::apply_replans(std::vector<Replan>& replans) {
  const auto& maps = *vexpert_maps();
  for (Replan& r : replans) {
    Timer timer;
    const balance::VExpertMap& after = maps.at(r.block);
    const balance::VExpertMap before = balance::VExpertMap::from_slots(
        after.ranks(), after.slots_per_rank(), after.experts(), r.slots_before);
    const std::vector<ExpertMove> moves = plan_moves(before, after, r.actions);
    move_experts(*layout_->experts(), expert_params(*params_, r.block), *optimizer_, moves);
    r.copies = static_cast<int64_t>(moves.size());
    r.measured_adjustment_s = timer.seconds();
  }
  sync_holders();
}

std::map<std::string, Tensor> Trainer::logical_experts(int root) const {
  std::map<std::string, Tensor> out;
  const auto* maps = vexpert_maps();
  if (!maps) return out;
  comm::Communicator& group = *layout_->experts();
  const std::vector<StateTensor> state = optimizer_state();
  for (const auto& [block, map] : *maps)
    for (Param* p : expert_params(*params_, block)) {
      std::vector<std::pair<std::string, Tensor>> tensors{{p->name, p->value}};
      for (const StateTensor& t : state)
        if (t.param == p) tensors.emplace_back(t.tensor.name, t.tensor.tensor);
      for (const auto& [name, slots] : tensors)
        for (int r = 0; r < group.size(); ++r)
          if (root < 0 || r == root) {
            Tensor whole = gather_experts(group, slots, map, r);
            if (r == group.rank()) out[name] = whole;
          }
    }
  return out;
}

}  // namespace moe::train
