// The adaptive offload choice (see moe/offload/plan.h).
#include "moe/offload/plan.h"

#include "moe/error.h"
#include "moe/models/memory.h"
#include "moe/offload/budget.h"
#include "moe/settings.h"

namespace moe::offload {

static std::string bytes(double b) { return format_bytes(b); }

OffloadPlan plan_offload(const PlanInput& in) {
  OffloadPlan plan;
  auto line = [&](std::string text) { plan.lines.push_back(std::move(text)); };
  const double resident = in.dense_bytes + in.expert_state_bytes;
  // The device tier of an offloaded run: the dense state beside a few experts' fp32 weights.
  const double offloaded_device = in.dense_bytes + 4 * in.slot_bytes;
  line(str("offload plan: dense state and activations ", bytes(in.dense_bytes), ", experts' state ",
           bytes(in.expert_state_bytes), " (", bytes(in.record_bytes),
           " per expert), their fp32 weights ", bytes(in.expert_weight_bytes)));
  line(str("  tiers: ", in.device_name, " ", bytes(in.device_capacity),
           in.device_is_host ? "" : str(", host memory ", bytes(in.host_capacity)), ", SSD ",
           in.ssd_capacity > 0 ? bytes(in.ssd_capacity) + " free"
                               : str("none (no ", flag_for(Setting::ssd_dir), ")")));
  if (in.device_capacity <= 0 || resident <= in.device_capacity) {
    plan.tier = Tier::none;
    line(str("  -> none: everything resident in ", in.device_name, " (", bytes(resident), ")"));
    return plan;
  }
  if (offloaded_device > in.device_capacity)
    throw UsageError(
        str(flag_for(Setting::offload), " auto: the dense state alone (", bytes(in.dense_bytes),
            " with four expert slots of ", bytes(in.slot_bytes), ") does not fit ", in.device_name,
            " (", bytes(in.device_capacity), "): ", bytes(offloaded_device - in.device_capacity),
            " short; a smaller model or batch, or ", flag_for(Setting::recompute), " block"));
  // Host: with a separate device the experts' state must fit the host beside nothing else; on
  // the CPU the host also holds the dense state.
  const double host_room =
      in.device_is_host ? in.device_capacity - offloaded_device : in.host_capacity;
  if (in.expert_state_bytes <= host_room && !in.device_is_host) {
    plan.tier = Tier::host;
    plan.device_budget = in.device_capacity - in.dense_bytes;
    line(str("  -> host: experts' state in host memory (", bytes(in.expert_state_bytes), " of ",
             bytes(host_room), "), dense state on the device"));
    return plan;
  }
  const double cache = std::max(0.0, host_room);
  if (in.ssd_capacity >= in.ssd_file_bytes && cache >= in.record_bytes) {
    plan.tier = Tier::ssd;
    plan.host_budget = cache;
    plan.device_budget =
        in.device_is_host ? 4 * in.slot_bytes : in.device_capacity - in.dense_bytes;
    line(str("  -> ssd: experts' state on SSD (", bytes(in.ssd_file_bytes), " of ",
             bytes(in.ssd_capacity), " free) behind a host cache of ", bytes(cache), " (",
             static_cast<long long>(cache / in.record_bytes), " of ",
             static_cast<long long>(in.expert_state_bytes / in.record_bytes), " experts)"));
    return plan;
  }
  if (cache < in.record_bytes)
    throw UsageError(str(flag_for(Setting::offload), " auto: host memory left for the experts (",
                         bytes(cache), ") is smaller than one expert's state (",
                         bytes(in.record_bytes), ")"));
  throw UsageError(str(
      flag_for(Setting::offload), " auto: the experts' state (", bytes(in.expert_state_bytes),
      ") fits neither ", in.device_name, " nor ",
      in.ssd_capacity > 0
          ? str("the SSD: ", flag_for(Setting::ssd_dir), " has ", bytes(in.ssd_capacity), " free, ",
                bytes(in.ssd_file_bytes - in.ssd_capacity), " short")
          : str("an SSD (give ", flag_for(Setting::ssd_dir), " DIR on local storage)")));
}

}  // namespace moe::offload
