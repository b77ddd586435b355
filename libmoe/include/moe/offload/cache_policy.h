// ExpertCache: the replacement policy of the tiered expert store's bounded host cache (in front of
// the SSD tier). It holds no expert data: it decides, per access, whether the expert is cached,
// which of `capacity` fixed slots (0..capacity-1) holds it, which key a newly admitted expert
// displaces (and whether that key must be written back first), and when dirty entries are flushed.
// The store keeps the bytes in a fixed array of slot buffers and wraps this class in its own lock:
// ExpertCache is single-threaded and does no I/O.
//
// Policies (issue 16):
//  - lru: on a miss with a full cache, evict the least recently accessed unpinned entry.
//  - lfu: MoESys's variant "akin to LFU". Every key has a popularity count (kept for keys that are
//    not cached too), incremented by 1 on every access (hit, admitted miss or bypass) BEFORE the
//    cache decides anything, so after access(k) returns, count(k) includes that access. Counts are
//    doubles because of the decay: every `period`-th end_step() multiplies every count (cached or
//    not) by `beta`. On a miss with a full cache the candidates for eviction are the cached,
//    unpinned entries whose own count is >= `threshold` (the threshold compares the count of the
//    cached entry, never the incoming key's); the victim is the candidate with the lowest count,
//    ties (exactly equal counts) going to the least recently accessed. With no candidate the
//    expert is served uncached (a bypass: not admitted, nothing evicted, counts still updated).
//    Threshold 0 makes every unpinned entry a candidate (LFU with history and LRU ties).
//
// Common to both:
//  - Free slots are filled first, lowest slot index first; a miss evicts only when all are used.
//  - Pinned entries (pin()/unpin(), counted: compute or the optimizer is using the slot) are never
//    evicted. A miss when every slot is pinned is a bypass under both policies (the store serves
//    the expert uncached rather than failing).
//  - Dirty write-back: mark_dirty() flags a cached entry whose slot holds newer state than the SSD.
//    Write-backs are reported, never performed: an eviction of a dirty entry returns it in the
//    Lookup (evicted_dirty: write the slot out before refilling it); a flush returns the keys to
//    write, sorted ascending, and marks them clean. A flush skips pinned entries (their slot may be
//    changing): they stay dirty and are written by their eviction or a later flush. A flush runs
//    every `flush_period`-th end_step() (0 = never periodically) and on an explicit flush().
//  - A step ends when the store calls end_step() (once per optimizer step, after every expert of
//    that step is released). end_step() first applies the LFU decay when due, then the periodic
//    flush when due.
//  - Stats: accesses = hits + misses; bypasses are the misses not admitted; evictions are admitted
//    misses that displaced a key; write_backs = dirty evictions + entries returned by flushes.
//  - Cost: a hit is O(1); a miss with a full cache scans the slots (O(capacity)), small next to
//    reading one expert from storage.
//
// The store's use, under its lock: r = access(k) once per use of expert k (a prefetch that claims
// the slot is that use: pin it then and do not access k again for the same use); on a miss with
// r.evicted and r.evicted_dirty, write slot r.slot's bytes back as *r.evicted before reading k into
// it; r.bypass(): read k into a scratch buffer and write it straight through if it changes. pin(k)
// while compute or the optimizer reads or writes the slot, mark_dirty(k) when its state changed,
// unpin(k); end_step() after the optimizer step, writing back the keys it returns.
#pragma once
#include <compare>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace moe::offload {

// One expert of one MoE layer.
struct ExpertKey {
  int32_t layer = 0;
  int32_t expert = 0;
  auto operator<=>(const ExpertKey&) const = default;
};

struct ExpertKeyHash {
  size_t operator()(const ExpertKey& k) const noexcept {
    return std::hash<uint64_t>()((static_cast<uint64_t>(static_cast<uint32_t>(k.layer)) << 32) |
                                 static_cast<uint32_t>(k.expert));
  }
};

std::string to_string(const ExpertKey& key);  // "layer 1 expert 7"

enum class CachePolicy { lru, lfu };
std::string to_string(CachePolicy policy);
// "lru" or "lfu"; anything else is a moe::UsageError naming --expert-cache.
CachePolicy parse_cache_policy(const std::string& name);

// MoESys LFU settings (flags --lfu-threshold, --lfu-beta, --lfu-period). The defaults had the best
// mean hit rate relative to the optimum over the settings tried on two training traces
// (docs/PERFORMANCE.md, "Expert cache hit rates").
struct LfuConfig {
  double threshold = 0.0;  // cached entries with count >= threshold may be evicted (>= 0)
  double beta = 0.75;      // decay factor, in (0, 1]; 1 = no decay
  int64_t period = 16;     // steps between decays (K >= 1)
};

struct CacheConfig {
  CachePolicy policy = CachePolicy::lru;
  int64_t capacity = 0;      // entries (slots); >= 1 (the store derives it from its byte budget)
  int64_t flush_period = 0;  // steps between periodic flushes; 0 = only explicit flush()
  LfuConfig lfu;             // used when policy == lfu
  // Throws moe::UsageError naming the offending flag and its valid range.
  void validate() const;
};

// What one access decided.
struct Lookup {
  bool hit = false;
  int32_t slot = -1;  // slot that holds the key after the access; -1: bypass (serve uncached)
  std::optional<ExpertKey> evicted;  // the key whose slot was taken (its data must leave first)
  bool evicted_dirty = false;        // the evicted key must be written back before the refill
  bool bypass() const { return slot < 0; }
};

struct CacheStats {
  int64_t accesses = 0, hits = 0, misses = 0, bypasses = 0, evictions = 0, write_backs = 0;
  double hit_rate() const { return accesses > 0 ? static_cast<double>(hits) / accesses : 0.0; }
};

class ExpertCache {
 public:
  explicit ExpertCache(const CacheConfig& config);  // validates the config

  // The access of `key` by compute or the optimizer: counts it, updates recency, and on a miss
  // admits it (into a free slot, or in place of a victim) or bypasses it. A hit never evicts.
  Lookup access(const ExpertKey& key);
  // A prefetch's admission of `key` ahead of its use: decided as access() decides (a hit when
  // cached; else a free slot, a victim, or a bypass), but neither counted in the stats nor in the
  // popularity counts, and the recency is left alone; the use itself is the later access().
  Lookup admit(const ExpertKey& key);

  // Pins are counted; pin/unpin/mark_dirty of a key that is not cached, and unpin of an entry that
  // is not pinned, are moe::Errors (a store bug), naming the key.
  void pin(const ExpertKey& key);
  void unpin(const ExpertKey& key);
  void mark_dirty(const ExpertKey& key);
  // Drops an unpinned cached key without a write-back (its slot's bytes are not the expert's:
  // a failed read); the slot is free for the next admission. Not counted in the stats.
  void erase(const ExpertKey& key);

  // Ends a step: decay when due (lfu), then the periodic flush when due; returns the keys to write
  // back (sorted, empty when no flush was due).
  std::vector<ExpertKey> end_step();
  // Every dirty, unpinned cached key (sorted ascending), marked clean.
  std::vector<ExpertKey> flush();

  bool contains(const ExpertKey& key) const { return slot_of(key) >= 0; }
  int32_t slot_of(const ExpertKey& key) const;  // -1 when not cached
  std::optional<ExpertKey> key_in_slot(int32_t slot) const;
  bool dirty(const ExpertKey& key) const;  // false when not cached
  int pins(const ExpertKey& key) const;    // 0 when not cached
  // The popularity count: under lfu as described above; under lru the plain access count (lru
  // never decays).
  double count(const ExpertKey& key) const;
  std::vector<ExpertKey> cached() const;  // sorted ascending

  int64_t capacity() const { return config_.capacity; }
  int64_t size() const { return used_; }
  int64_t steps() const { return steps_; }  // end_step() calls so far
  const CacheStats& stats() const { return stats_; }
  const CacheConfig& config() const { return config_; }

 private:
  struct Slot {
    std::optional<ExpertKey> key;
    uint64_t last_use = 0;  // access clock of the latest access
    int pins = 0;
    bool dirty = false;
  };
  Slot& cached_slot(const ExpertKey& key, const char* what);
  int32_t choose_victim() const;  // -1: no candidate
  // Finds key's slot, or takes a free slot or a victim's for it (-1: bypass); no stats.
  Lookup place(const ExpertKey& key, uint64_t now);

  CacheConfig config_;
  std::vector<Slot> slots_;
  std::unordered_map<ExpertKey, int32_t, ExpertKeyHash> slot_of_;
  std::unordered_map<ExpertKey, double, ExpertKeyHash> counts_;
  uint64_t clock_ = 0;
  int64_t used_ = 0, steps_ = 0;
  CacheStats stats_;
};

}  // namespace moe::offload
