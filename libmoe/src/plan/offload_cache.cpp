// The SSD tier's host cache hit rate (moe/plan/offload_cache.h).
#include "moe/plan/offload_cache.h"

#include <algorithm>

namespace moe::plan {

double host_cache_hit_rate(const offload::AccessSequence& all,
                           const std::vector<int64_t>& experts_per_moe_layer, const Layout& layout,
                           int64_t capacity) {
  offload::AccessSequence mine;
  mine.experts = all.experts;
  for (const auto& step : all.steps) {
    auto& kept = mine.steps.emplace_back();
    for (const offload::Access& a : step) {
      const int64_t E = experts_per_moe_layer.at(size_t(a.key.layer));
      if (layout.placement != Placement::fixed || a.key.expert < E / layout.ep) kept.push_back(a);
    }
  }
  offload::CacheConfig config;
  config.policy = offload::CachePolicy::lru;
  config.capacity = std::max<int64_t>(capacity, 1);
  return offload::simulate(config, mine).stats.hit_rate();
}

}  // namespace moe::plan
