// A training layout to plan: how the ranks of a cluster split a model's work, written as one
// string of key=value pairs with moe-train's flag words, e.g.
//   "ep=8,zero=3,offload=host,placement=flexmoe,a2a=hierarchical,scheduler=priority"
// Keys (each at most once; defaults as moe-train's):
//   ep         expert-parallel ranks (1); dp = ranks / ep is implied, or given as dp= and checked
//   zero       ZeRO stage of the dense state, 0..3 (0)
//   offload    none | host | ssd (none): where the experts' state lives
//   placement  static | lpt | flexmoe (static)
//   a2a        flat | hierarchical (flat)
//   scheduler  off | priority (off): Lina's priority scheduler of all-to-all over all-reduce
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moe/comm/all_to_all.h"
#include "moe/comm/scheduler.h"
#include "moe/offload/tier.h"

namespace moe::plan {

// moe-train --offload's values (a layout never holds automatic: it names the tier it plans).
using OffloadTier = offload::Tier;
// moe-train --placement's values. Its own enum (train::PlacementRule) is in the train layer,
// above plan (cmake/CheckLayers.cmake), so plan cannot name it; this one mirrors it value for
// value (fixed is moe-train's "static").
enum class Placement { fixed, lpt, flexmoe };

struct Layout {
  int64_t ep = 1;
  int64_t dp = 0;  // 0: ranks / ep (resolved by check_layout)
  int zero = 0;
  OffloadTier offload = OffloadTier::none;
  Placement placement = Placement::fixed;
  comm::A2AAlgorithm a2a = comm::A2AAlgorithm::flat;
  comm::SchedulerMode scheduler = comm::SchedulerMode::off;
};

const char* placement_name(Placement placement);

// UsageError naming the key (or the pair) that is unknown, repeated, empty or out of range.
Layout parse_layout(std::string_view text);
// The layout's string again, every key written ("ep=8,dp=2,zero=0,...").
std::string layout_text(const Layout& layout);

// Resolves dp and checks the layout against `ranks` ranks and MoE layers of `experts_per_layer`
// experts: ep and dp must divide the ranks (ep * dp == ranks), ep every layer's experts;
// lpt/flexmoe need ep > 1. UsageError saying which number does not divide which.
Layout check_layout(Layout layout, int64_t ranks, const std::vector<int64_t>& experts_per_layer);

}  // namespace moe::plan
