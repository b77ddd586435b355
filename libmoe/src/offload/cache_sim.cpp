// Access sequences from routing traces, cache replay and Belady's optimum (see
// moe/offload/cache_sim.h).
#include "moe/offload/cache_sim.h"

#include <limits>
#include <set>
#include <unordered_map>
#include <utility>

#include "moe/error.h"

namespace moe::offload {

int64_t AccessSequence::accesses() const {
  int64_t n = 0;
  for (const auto& s : steps) n += static_cast<int64_t>(s.size());
  return n;
}

std::vector<ExpertKey> AccessSequence::keys() const {
  std::vector<ExpertKey> out;
  out.reserve(static_cast<size_t>(accesses()));
  for (const auto& s : steps)
    for (const Access& a : s) out.push_back(a.key);
  return out;
}

AccessSequence training_accesses(const io::TraceReader& trace) {
  const io::TraceInfo& info = trace.info();
  const int64_t layers = trace.layers(), emax = trace.max_experts(), batches = trace.batches();
  const std::vector<int64_t> loads = trace.loads();  // [B, L, Emax]
  const std::vector<int64_t> steps = trace.batch_steps();
  AccessSequence seq;
  for (int64_t e : info.experts) seq.experts += e;
  for (int64_t b = 0; b < batches; ++b) {
    // A new step unless this batch continues the previous batch's (accumulated) step.
    bool same_step = b > 0 && steps[static_cast<size_t>(b)] >= 0 &&
                     steps[static_cast<size_t>(b)] == steps[static_cast<size_t>(b - 1)];
    if (!same_step) seq.steps.emplace_back();
    std::vector<Access>& out = seq.steps.back();
    auto touched = [&](int64_t l, int64_t e) {
      return loads[static_cast<size_t>((b * layers + l) * emax + e)] > 0;
    };
    for (int64_t l = 0; l < layers; ++l)
      for (int64_t e = 0; e < info.experts[static_cast<size_t>(l)]; ++e)
        if (touched(l, e))
          out.push_back({{static_cast<int32_t>(l), static_cast<int32_t>(e)}, false});
    for (int64_t l = layers - 1; l >= 0; --l)
      for (int64_t e = 0; e < info.experts[static_cast<size_t>(l)]; ++e)
        if (touched(l, e))
          out.push_back({{static_cast<int32_t>(l), static_cast<int32_t>(e)}, true});
  }
  return seq;
}

Simulation simulate(const CacheConfig& config, const AccessSequence& sequence) {
  ExpertCache cache(config);
  Simulation sim;
  for (const auto& step : sequence.steps) {
    for (const Access& a : step) {
      Lookup r = cache.access(a.key);
      if (!a.writes) continue;
      if (r.bypass())
        sim.uncached_writes++;
      else
        cache.mark_dirty(a.key);
    }
    cache.end_step();
  }
  sim.stats = cache.stats();
  return sim;
}

int64_t belady_hits(const std::vector<ExpertKey>& keys, int64_t capacity, bool allow_bypass) {
  MOE_USAGE_CHECK(capacity >= 1, "belady: capacity ", capacity, " entries: must be >= 1");
  const int64_t n = static_cast<int64_t>(keys.size());
  const int64_t never = std::numeric_limits<int64_t>::max();
  // next_use[i]: the next position of keys[i] after i (never: not used again).
  std::vector<int64_t> next_use(static_cast<size_t>(n));
  std::unordered_map<ExpertKey, int64_t, ExpertKeyHash> seen;
  for (int64_t i = n - 1; i >= 0; --i) {
    auto it = seen.find(keys[static_cast<size_t>(i)]);
    next_use[static_cast<size_t>(i)] = it == seen.end() ? never : it->second;
    seen[keys[static_cast<size_t>(i)]] = i;
  }
  // Cached keys by their next use; the farthest is the last element.
  std::set<std::pair<int64_t, ExpertKey>> by_next;
  std::unordered_map<ExpertKey, int64_t, ExpertKeyHash> cached_next;
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const ExpertKey& k = keys[static_cast<size_t>(i)];
    const int64_t next = next_use[static_cast<size_t>(i)];
    if (auto it = cached_next.find(k); it != cached_next.end()) {
      hits++;
      by_next.erase({it->second, k});
      it->second = next;
      by_next.insert({next, k});
      continue;
    }
    if (static_cast<int64_t>(by_next.size()) >= capacity) {
      auto farthest = std::prev(by_next.end());
      // Declining to admit is optimal when the incoming key is needed no sooner than any cached
      // one.
      if (allow_bypass && next >= farthest->first) continue;
      cached_next.erase(farthest->second);
      by_next.erase(farthest);
    }
    cached_next.emplace(k, next);
    by_next.insert({next, k});
  }
  return hits;
}

}  // namespace moe::offload
