// The offload settings as the user gives them (moe-train --offload and its group): where the
// experts' state lives and how the tiered store (moe/offload/tiered_store.h) moves it. One struct,
// held by the training config (TrainConfig::offload, saved with every checkpoint) and by the
// store's own config (StoreConfig::settings), so that no field is copied from one to the other.
#pragma once
#include <cstdint>
#include <string>

#include "moe/offload/budget.h"
#include "moe/offload/cache_policy.h"
#include "moe/offload/tier.h"
#include "moe/settings.h"

namespace moe::offload {

struct StoreSettings {
  // none (every expert resident) | host | ssd | auto (offload::plan_offload picks). The store
  // itself holds host or ssd: StoreConfig::tier is the tier resolved.
  Tier tier = Tier::none;
  // Byte sizes as written ("512MiB", "25%"; "": the default), the text a checkpoint saves; read
  // once by parse_budgets.
  std::string device_budget;   // device slots (fp32 weights of the experts computing)
  std::string host_budget;     // expert state in host memory (ssd: the host cache)
  std::string ssd_dir;         // ssd: where the per-expert files go (offload::ExpertFiles)
  double pin_fraction = 0.25;  // of this process's experts, kept resident from forward to backward
  int64_t prefetch_depth = 2;  // experts uploaded ahead of the one computing (0: on demand)
  // Each expert's AdamW as soon as its gradient is final, during backward (when nothing clips).
  bool optimizer_overlap = true;
  CachePolicy expert_cache = CachePolicy::lru;  // ssd: the host cache's policy (MoESys: lfu)
  LfuConfig lfu;
  // Tests only, never saved: on the CPU, run the CUDA path (staging buffers, gradient buffers
  // drained on the optimizer thread) with host memory and synchronous copies, so that the CPU
  // tests cover its logic.
  bool stage_on_host = false;
};

// The budgets in bytes; 0 where the text is empty (the default). UsageError naming the setting's
// flag for a size that does not parse.
struct StoreBudgets {
  int64_t device = 0, host = 0;
};
inline StoreBudgets parse_budgets(const StoreSettings& settings) {
  StoreBudgets b;
  if (!settings.device_budget.empty())
    b.device = parse_bytes(flag_for(Setting::device_budget), settings.device_budget, 0);
  if (!settings.host_budget.empty())
    b.host = parse_bytes(flag_for(Setting::host_budget), settings.host_budget, 0);
  return b;
}

}  // namespace moe::offload
