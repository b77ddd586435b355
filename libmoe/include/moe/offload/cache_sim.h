// Offline evaluation of the expert cache policies (moe/offload/cache_policy.h): the access
// sequence a training store sees, replayed through an ExpertCache (simulate), and the offline
// optimum (Belady) of the same sequence as the ceiling. Used by moe-cache-bench and the tests; the
// store itself never needs them.
//
// The training access order, per traced batch (one forward and backward pass): forward, MoE layer
// 0..L-1, in each layer the experts that received at least one token (loads > 0), ascending; then
// backward, layer L-1..0, the same experts ascending. Backward accesses write (the expert's
// gradient and optimizer step change its state), forward accesses only read. Consecutive batches
// with the same training step (gradient accumulation) form one step; batches of a trace without
// steps (moe-profile record, step -1) are one step each. The store calls end_step() after each.
#pragma once
#include <cstdint>
#include <vector>

#include "moe/io/trace.h"
#include "moe/offload/cache_policy.h"

namespace moe::offload {

struct Access {
  ExpertKey key;
  bool writes = false;  // the access changes the expert's state (marks its cache entry dirty)
};

struct AccessSequence {
  std::vector<std::vector<Access>> steps;  // accesses of each step, in order
  int64_t experts = 0;                     // experts of all MoE layers (the distinct keys possible)
  int64_t accesses() const;
  std::vector<ExpertKey> keys() const;  // every access's key, steps concatenated
};

// The training store's access sequence for a routing trace (moe-train --trace; every traced step
// is taken as a step, so record with --trace-every 1 for the sequence the store really sees).
AccessSequence training_accesses(const io::TraceReader& trace);

struct Simulation {
  CacheStats stats;
  int64_t uncached_writes = 0;  // writing accesses that were bypassed (written straight through)
};

// Replays `sequence` through a fresh ExpertCache(config): access() each key, mark_dirty() after a
// writing access that was admitted or hit, end_step() after each step. Nothing is pinned. Dirty
// entries still cached at the end are not flushed (not counted as write-backs).
Simulation simulate(const CacheConfig& config, const AccessSequence& sequence);

// Hits of the optimal offline replacement of `keys` with `capacity` entries: on a miss with a
// full cache, evict the key whose next use is farthest in the future. With allow_bypass the
// incoming key competes too (it is not admitted when it is the farthest, or never used again):
// the optimum over every policy that may decline to admit (an upper bound for lru and lfu).
// Without, it is the optimum of caches that admit every miss (Belady's MIN). O(n log capacity).
int64_t belady_hits(const std::vector<ExpertKey>& keys, int64_t capacity, bool allow_bypass = true);

}  // namespace moe::offload
