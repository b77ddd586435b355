// ExpertCache: LRU and MoESys's LFU variant over a fixed array of slots (see
// moe/offload/cache_policy.h for the exact semantics the tests pin down).
#include "moe/offload/cache_policy.h"

#include <algorithm>
#include <cmath>

#include "moe/error.h"
#include "moe/settings.h"

namespace moe::offload {

std::string to_string(const ExpertKey& key) {
  return str("layer ", key.layer, " expert ", key.expert);
}

std::string to_string(CachePolicy policy) { return policy == CachePolicy::lru ? "lru" : "lfu"; }

CachePolicy parse_cache_policy(const std::string& name) {
  if (name == "lru") return CachePolicy::lru;
  if (name == "lfu") return CachePolicy::lfu;
  throw UsageError(str(flag_for(Setting::expert_cache), " '", name, "': expected lru or lfu"));
}

void CacheConfig::validate() const {
  MOE_USAGE_CHECK(capacity >= 1, "expert cache capacity ", capacity,
                  " entries: the host cache must hold at least one expert (raise ",
                  flag_for(Setting::host_budget), ")");
  MOE_USAGE_CHECK(capacity <= INT32_MAX, "expert cache capacity ", capacity,
                  " entries: at most 2^31 - 1 slots");
  MOE_USAGE_CHECK(flush_period >= 0, "expert cache flush period ", flush_period,
                  " steps: must be >= 0 (0 = flush only on demand)");
  if (policy != CachePolicy::lfu) return;
  MOE_USAGE_CHECK(std::isfinite(lfu.threshold) && lfu.threshold >= 0.0,
                  flag_for(Setting::lfu_threshold), " ", lfu.threshold,
                  ": must be a finite count >= 0");
  MOE_USAGE_CHECK(lfu.beta > 0.0 && lfu.beta <= 1.0, flag_for(Setting::lfu_beta), " ", lfu.beta,
                  ": must be in (0, 1] (the factor counts are multiplied by; 1 = no decay)");
  MOE_USAGE_CHECK(lfu.period >= 1, flag_for(Setting::lfu_period), " ", lfu.period,
                  ": must be >= 1 (steps between decays of the counts)");
}

ExpertCache::ExpertCache(const CacheConfig& config) : config_(config) {
  config_.validate();
  slots_.resize(static_cast<size_t>(config_.capacity));
  slot_of_.reserve(slots_.size());
}

int32_t ExpertCache::slot_of(const ExpertKey& key) const {
  auto it = slot_of_.find(key);
  return it == slot_of_.end() ? -1 : it->second;
}

std::optional<ExpertKey> ExpertCache::key_in_slot(int32_t slot) const {
  MOE_CHECK(slot >= 0 && slot < static_cast<int64_t>(slots_.size()), "expert cache: slot ", slot,
            " outside [0, ", slots_.size(), ")");
  return slots_[static_cast<size_t>(slot)].key;
}

ExpertCache::Slot& ExpertCache::cached_slot(const ExpertKey& key, const char* what) {
  int32_t slot = slot_of(key);
  MOE_CHECK(slot >= 0, "expert cache: ", what, " of ", to_string(key),
            ", which is not cached (the store must access() it first and not bypass)");
  return slots_[static_cast<size_t>(slot)];
}

bool ExpertCache::dirty(const ExpertKey& key) const {
  int32_t slot = slot_of(key);
  return slot >= 0 && slots_[static_cast<size_t>(slot)].dirty;
}

int ExpertCache::pins(const ExpertKey& key) const {
  int32_t slot = slot_of(key);
  return slot >= 0 ? slots_[static_cast<size_t>(slot)].pins : 0;
}

double ExpertCache::count(const ExpertKey& key) const {
  auto it = counts_.find(key);
  return it == counts_.end() ? 0.0 : it->second;
}

std::vector<ExpertKey> ExpertCache::cached() const {
  std::vector<ExpertKey> keys;
  keys.reserve(slot_of_.size());
  for (const auto& [key, slot] : slot_of_) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

void ExpertCache::pin(const ExpertKey& key) { cached_slot(key, "pin").pins++; }

void ExpertCache::unpin(const ExpertKey& key) {
  Slot& s = cached_slot(key, "unpin");
  MOE_CHECK(s.pins > 0, "expert cache: unpin of ", to_string(key),
            ", which is not pinned (unpin without a matching pin)");
  s.pins--;
}

void ExpertCache::mark_dirty(const ExpertKey& key) { cached_slot(key, "mark_dirty").dirty = true; }

int32_t ExpertCache::choose_victim() const {
  // Scans every slot: the cache is full here (free slots are taken first).
  int32_t victim = -1;
  double victim_count = 0.0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.pins > 0) continue;
    if (config_.policy == CachePolicy::lru) {
      if (victim < 0 || s.last_use < slots_[static_cast<size_t>(victim)].last_use)
        victim = static_cast<int32_t>(i);
      continue;
    }
    double c = count(*s.key);
    if (c < config_.lfu.threshold) continue;
    if (victim < 0 || c < victim_count ||
        (c == victim_count && s.last_use < slots_[static_cast<size_t>(victim)].last_use)) {
      victim = static_cast<int32_t>(i);
      victim_count = c;
    }
  }
  return victim;
}

Lookup ExpertCache::access(const ExpertKey& key) {
  // Counted before any decision (documented in the header): the count is the key's popularity.
  counts_[key] += 1.0;
  stats_.accesses++;
  const Lookup r = place(key, ++clock_);
  if (r.hit) {
    stats_.hits++;
    return r;
  }
  stats_.misses++;
  if (r.bypass()) stats_.bypasses++;
  if (r.evicted) stats_.evictions++;
  if (r.evicted_dirty) stats_.write_backs++;
  return r;
}

Lookup ExpertCache::admit(const ExpertKey& key) {
  if (int32_t slot = slot_of(key); slot >= 0) return Lookup{true, slot, std::nullopt, false};
  // A fresh entry's recency is the clock as it stands: the next access() makes it the newest.
  return place(key, clock_);
}

Lookup ExpertCache::place(const ExpertKey& key, uint64_t now) {
  Lookup r;
  if (int32_t slot = slot_of(key); slot >= 0) {
    slots_[static_cast<size_t>(slot)].last_use = now;
    r.hit = true;
    r.slot = slot;
    return r;
  }
  int32_t slot = -1;
  if (used_ < config_.capacity) {  // the lowest free slot (erase() may free any)
    while (slots_[static_cast<size_t>(++slot)].key) {
    }
    ++used_;
  } else {
    slot = choose_victim();
    if (slot < 0) return r;
    Slot& v = slots_[static_cast<size_t>(slot)];
    r.evicted = v.key;
    r.evicted_dirty = v.dirty;
    slot_of_.erase(*v.key);
  }
  Slot& s = slots_[static_cast<size_t>(slot)];
  s = Slot{key, now, 0, false};
  slot_of_.emplace(key, slot);
  r.slot = slot;
  return r;
}

void ExpertCache::erase(const ExpertKey& key) {
  Slot& s = cached_slot(key, "erase");
  MOE_CHECK(s.pins == 0, "expert cache: erase of ", to_string(key), ", which is pinned");
  slot_of_.erase(key);
  s = Slot{};
  --used_;
}

std::vector<ExpertKey> ExpertCache::flush() {
  std::vector<ExpertKey> out;
  for (Slot& s : slots_) {
    if (!s.key || !s.dirty || s.pins > 0) continue;
    s.dirty = false;
    out.push_back(*s.key);
  }
  std::sort(out.begin(), out.end());
  stats_.write_backs += static_cast<int64_t>(out.size());
  return out;
}

std::vector<ExpertKey> ExpertCache::end_step() {
  steps_++;
  if (config_.policy == CachePolicy::lfu && steps_ % config_.lfu.period == 0 &&
      config_.lfu.beta != 1.0) {
    for (auto& [key, c] : counts_) c *= config_.lfu.beta;
  }
  if (config_.flush_period > 0 && steps_ % config_.flush_period == 0) return flush();
  return {};
}

}  // namespace moe::offload
