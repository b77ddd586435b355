// Where a training run keeps its experts' state (the offload setting; moe-train --offload): the
// values, their names as the user writes them, and the one parser.
#pragma once
#include <string_view>

namespace moe::offload {

// none: every expert resident where compute runs; host: host memory; ssd: per-expert files behind
// a bounded host cache; automatic ("auto"): offload::plan_offload picks none, host or ssd from the
// budgets. A TieredStore holds host or ssd only.
enum class Tier { none, host, ssd, automatic };

const char* tier_name(Tier tier);  // "none" | "host" | "ssd" | "auto"
// Throws UsageError naming the setting's flag and listing its values for any other name.
Tier parse_tier(std::string_view name);

}  // namespace moe::offload
