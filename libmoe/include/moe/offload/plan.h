// The adaptive choice of ES-MoE (--offload auto): no offload when all state fits the device,
// else the experts' state in host memory, else on SSD behind a host cache; refused, naming the
// tier and the shortfall, when nothing fits. The capacity plan is MoESys's eq. 1 (per process:
// dense state on the device beside the experts computing, the active experts' state in host
// memory, all experts' state on SSD) generalised to our byte counts per dtype: a record holds
// the storage value, an fp32 master for bf16/f16, AdamW's m and v and the gradient.
#pragma once
#include <string>
#include <vector>

#include "moe/offload/tier.h"

namespace moe::offload {

struct PlanInput {
  double dense_bytes = 0;          // non-expert state and a step's activations, on the device
  double expert_state_bytes = 0;   // every expert's record (value, master, m, v, gradient)
  double expert_weight_bytes = 0;  // the fp32 weights of every expert (resident compute)
  double slot_bytes = 0;           // one expert's fp32 weights: the device tier's unit
  double record_bytes = 0;         // one expert's record: the host cache's unit
  double ssd_file_bytes = 0;       // every expert's SSD file (record + header)
  // What each tier may hold (0: none / unknown). device: --device-budget, or the device's memory;
  // host: --host-budget, or the machine's memory; ssd: free bytes of --ssd-dir (0 without one).
  double device_capacity = 0, host_capacity = 0, ssd_capacity = 0;
  bool device_is_host = true;  // CPU runs: "device" and "host" are the same memory
  std::string device_name = "CPU memory";
};

struct OffloadPlan {
  Tier tier = Tier::none;          // none | host | ssd
  double host_budget = 0;          // ssd: the host cache's bytes
  double device_budget = 0;        // host/ssd: the device slots' bytes (beside the dense state)
  std::vector<std::string> lines;  // the plan, for the log: what lives where, bytes per tier
};

// Throws UsageError "--offload auto: ... does not fit: <tier> needs N more" when no tier fits.
OffloadPlan plan_offload(const PlanInput& input);

}  // namespace moe::offload
