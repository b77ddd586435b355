// The SSD tier's host cache hit rate for a layout, measured by replaying the trace's training
// accesses (offload::training_accesses) through the store's own replacement policy
// (offload::simulate), not guessed: moe-plan prices an SSD upload by it.
#pragma once
#include <cstdint>
#include <vector>

#include "moe/offload/cache_sim.h"
#include "moe/plan/layout.h"

namespace moe::plan {

// The hit rate of rank 0's accesses in `all` (static placement: the experts [0, E_l/ep) of each
// MoE layer l; lpt and flexmoe: every expert) through an LRU cache of `capacity` experts (>= 1).
// 0 when rank 0 makes no access.
double host_cache_hit_rate(const offload::AccessSequence& all,
                           const std::vector<int64_t>& experts_per_moe_layer, const Layout& layout,
                           int64_t capacity);

}  // namespace moe::plan
