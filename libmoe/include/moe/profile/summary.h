// Expert popularity of a routing trace (moe/io/trace.h), one summary per MoE layer: counts,
// imbalance, entropy, drops (moe-profile summary).
//
// Shape letters: L MoE layers, k experts per token, E experts of a layer.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "moe/io/trace.h"

namespace moe::profile {

// One MoE layer over a whole trace. Counts are assignments (every one of a token's k choices),
// before capacity.
struct LayerSummary {
  int64_t layer = 0, block = 0, experts = 0;
  int64_t tokens = 0, assignments = 0, dropped = 0;
  std::vector<int64_t> counts;  // [E]
  double max_over_mean = 0;     // max count / mean count
  double max_over_min = 0;      // max / min; infinity when an expert got nothing
  double cv = 0;                // coefficient of variation: std / mean (population std)
  double entropy_bits = 0;      // of the load distribution; log2(E) when perfectly balanced
  double entropy_norm = 0;      // entropy_bits / log2(E) (1 = balanced)
  double dropped_fraction = 0;  // dropped / assignments
  std::vector<int64_t> top;     // experts by count, descending (ties: lower id first)
};
std::vector<LayerSummary> summarize(const io::TraceReader& trace);
nlohmann::json to_json(const LayerSummary& s);

}  // namespace moe::profile
