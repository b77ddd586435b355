// Trainer's side of --offload (the expert store, moe/offload/tiered_store.h): the auto plan
// printed before step 1, the store's configuration from the training settings, and the ranks whose
// expert gradients the store sums.
#include <algorithm>
#include <string>

#include "moe/log.h"
#include "moe/models/memory.h"
#include "moe/offload/budget.h"
#include "moe/offload/plan.h"
#include "moe/settings.h"
#include "moe/train/trainer.h"

namespace moe::train {

// --offload auto: the tier the plan picks (offload::plan_offload), printed before step 1.
void Trainer::plan_offload(const ModelConfig& config, Device device) {
  const double ep = double(std::max<int64_t>(train_.ep, 1));
  const double table = train_.shard_embedding ? 1.0 / world_size() : 1.0;
  const double dense = parameter_lower_bound(config, 0, table);
  const double experts = parameter_lower_bound(config, 1 / ep, table) - dense;
  double local_experts = 0;
  for (int64_t e : config.experts_per_layer) local_experts += double(e) / ep;
  const double storage = double(dtype_size(config.dtype));
  const double per_param = storage + (config.dtype == DType::f32 ? 0 : 4) + 12;
  offload::PlanInput in;
  in.dense_bytes = dense * (2 * storage + 8) + double(train_.batch) / world_size() /
                                                   double(std::max<int64_t>(train_.grad_accum, 1)) *
                                                   double(config.seq) * double(config.vocab_size) *
                                                   4;
  in.expert_state_bytes = experts * per_param;
  in.expert_weight_bytes = experts * 4;
  in.slot_bytes = local_experts > 0 ? experts * 4 / local_experts : 0;
  in.record_bytes = local_experts > 0 ? in.expert_state_bytes / local_experts : 0;
  in.ssd_file_bytes = in.expert_state_bytes + 4096 * local_experts;
  const double machine = machine_memory().usable();
  const offload::StoreSettings& set = train_.offload;
  const offload::StoreBudgets given = offload::parse_budgets(set);
  in.device_capacity = !set.device_budget.empty() ? double(given.device) : machine;
  in.host_capacity = !set.host_budget.empty() ? double(given.host) : machine;
  // The library cannot ask a GPU how much memory is free for this run: the budget says.
  MOE_USAGE_CHECK(device.kind == Device::cpu || !set.device_budget.empty(),
                  flag_for(Setting::offload), " auto with ", flag_for(Setting::device), " ",
                  device.str(), " needs ", flag_for(Setting::device_budget),
                  " SIZE: the GPU memory the plan may give the dense state "
                  "and the expert slots");
  in.device_is_host = device.kind == Device::cpu;
  in.device_name = device.kind == Device::cpu ? "CPU memory" : "GPU memory";
  if (!set.ssd_dir.empty())
    in.ssd_capacity = double(std::max<int64_t>(0, offload::free_bytes(set.ssd_dir)));
  const offload::OffloadPlan plan = offload::plan_offload(in);
  for (const std::string& line : plan.lines) MOE_LOG_INFO(line);
  offload_tier_ = plan.tier;
  auto_host_budget_ = static_cast<int64_t>(plan.host_budget);
  auto_device_budget_ = static_cast<int64_t>(plan.device_budget);
}

// The store's config: the run's offload settings as they are, and what the trainer resolved: the
// tier and budgets (auto: the plan's; otherwise the settings' sizes, parsed here once), where
// compute runs, the ranks, AdamW's settings.
offload::StoreConfig Trainer::store_config(Device device) const {
  offload::StoreConfig c;
  c.settings = train_.offload;
  c.tier = offload_tier_;
  c.device = device;  // the slots and gradient buffers live where compute runs
  if (train_.offload.tier == offload::Tier::automatic) {  // the plan's split of the budgets
    c.host_budget = auto_host_budget_;
    c.device_budget = auto_device_budget_;
  } else {
    const offload::StoreBudgets budgets = offload::parse_budgets(train_.offload);
    c.device_budget = budgets.device;
    c.host_budget = budgets.host;
  }
  c.world = world_size() > 1 ? world_ : nullptr;  // ranks sharing a disk check it together
  c.adamw = adamw_config();
  return c;
}

// The ranks holding the same experts as this one (their expert gradients are summed), or null.
comm::Communicator* Trainer::expert_replicas() const {
  if (world_size() == 1) return nullptr;
  if (train_.ep == 1) return world_;
  comm::Communicator* replicas = layout_->replicas();
  return replicas && replicas->size() > 1 ? replicas : nullptr;
}

}  // namespace moe::train
