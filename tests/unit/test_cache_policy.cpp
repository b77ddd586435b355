// Expert cache policies (moe/offload/cache_policy.h, cache_sim.h) against hand-worked sequences:
// LRU; MoESys's LFU variant (counts kept for uncached keys, ties to the least recent, threshold,
// decay every K steps, the no-candidate bypass); pins; dirty write-back on eviction and on the
// flush period; Belady on a textbook sequence and against an exhaustive search; properties on
// random sequences; the training access order built from a routing trace; bad configurations.
// Keys are written as letters A, B, C... = experts 0, 1, 2... of layer 0.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "moe/error.h"
#include "moe/offload/cache_sim.h"
#include "support/run.h"

using namespace moe;
using offload::CacheConfig;
using offload::CachePolicy;
using offload::ExpertCache;
using offload::ExpertKey;
using offload::Lookup;

namespace {

constexpr int A = 0, B = 1, C = 2, D = 3, E = 4;
constexpr int kNone = -1;

ExpertKey key(int expert, int layer = 0) { return {layer, expert}; }

// One access and what it must decide: hit, slot (-1 = bypass), evicted key (kNone) and whether
// that key was dirty.
struct Row {
  int key;
  bool hit;
  int slot;
  int evicted;
  bool evicted_dirty = false;
};

void check(ExpertCache& cache, const Row& row, int index) {
  INFO("access " << index << ": key " << row.key);
  Lookup r = cache.access(key(row.key));
  CHECK(r.hit == row.hit);
  CHECK(r.slot == row.slot);
  CHECK(r.bypass() == (row.slot < 0));
  if (row.evicted == kNone) {
    CHECK_FALSE(r.evicted.has_value());
  } else {
    REQUIRE(r.evicted.has_value());
    CHECK(*r.evicted == key(row.evicted));
  }
  CHECK(r.evicted_dirty == row.evicted_dirty);
}

std::vector<ExpertKey> keys(std::initializer_list<int> experts) {
  std::vector<ExpertKey> out;
  for (int e : experts) out.push_back(key(e));
  return out;
}

CacheConfig lfu_config(int64_t capacity, double threshold, double beta, int64_t period) {
  CacheConfig c;
  c.policy = CachePolicy::lfu;
  c.capacity = capacity;
  c.lfu = {threshold, beta, period};
  return c;
}

}  // namespace

TEST_CASE("cache: LRU evicts the least recently used entry, dirty victims are reported",
          "[cache]") {
  ExpertCache cache({CachePolicy::lru, 3, 0, {}});
  // Cache after each access (slot 0, 1, 2), recency oldest -> newest in brackets.
  const std::vector<Row> table = {
      {A, false, 0, kNone},    // A - -        [A]
      {B, false, 1, kNone},    // A B -        [A B]
      {C, false, 2, kNone},    // A B C        [A B C]   C marked dirty
      {A, true, 0, kNone},     // A B C        [B C A]
      {D, false, 1, B},        // A D C        [C A D]   D marked dirty
      {B, false, 2, C, true},  // A D B        [A D B]   C was dirty: write back
      {E, false, 0, A},        // E D B        [D B E]
      {A, false, 1, D, true},  // E A B        [B E A]   D was dirty: write back
  };
  for (size_t i = 0; i < table.size(); ++i) {
    check(cache, table[i], static_cast<int>(i));
    if (table[i].key == C || table[i].key == D) cache.mark_dirty(key(table[i].key));
  }
  CHECK(cache.cached() == keys({A, B, E}));
  CHECK(cache.slot_of(key(E)) == 0);
  CHECK(cache.key_in_slot(2) == key(B));
  const auto& s = cache.stats();
  CHECK(s.accesses == 8);
  CHECK(s.hits == 1);
  CHECK(s.misses == 7);
  CHECK(s.bypasses == 0);
  CHECK(s.evictions == 4);
  CHECK(s.write_backs == 2);
  CHECK(s.hit_rate() == Approx(1.0 / 8));
}

TEST_CASE("cache: LFU keeps counts of uncached keys and breaks ties by recency", "[cache]") {
  // Threshold 0 (every unpinned entry is a candidate), no decay.
  ExpertCache cache(lfu_config(2, 0.0, 1.0, 1));
  const std::vector<Row> table = {
      {A, false, 0, kNone},  // A=1            cache A -
      {B, false, 1, kNone},  // B=1            cache A B
      {A, true, 0, kNone},   // A=2            cache A B
      {C, false, 1, B},      // C=1: A=2 B=1 -> B      cache A C
      {B, false, 1, C},      // B=2 (history kept): A=2 C=1 -> C (LRU would evict A)   cache A B
      {C, false, 0, A},      // C=2: A=2 B=2, tie -> A, used at access 3, before B's 5   cache C B
      {A, false, 1, B},      // A=3: C=2 (access 6) B=2 (access 5), tie -> B   cache C A
      {C, true, 0, kNone},   // C=3
  };
  for (size_t i = 0; i < table.size(); ++i) check(cache, table[i], static_cast<int>(i));
  CHECK(cache.count(key(A)) == 3.0);
  CHECK(cache.count(key(B)) == 2.0);  // not cached, still counted
  CHECK(cache.count(key(C)) == 3.0);
  CHECK(cache.count(key(D)) == 0.0);
  CHECK(cache.stats().hits == 2);
  CHECK(cache.stats().evictions == 4);
  CHECK(cache.stats().bypasses == 0);
}

TEST_CASE("cache: LFU threshold, decay every K steps and the no-candidate bypass", "[cache]") {
  // Threshold 2: only cached entries with count >= 2 may be evicted. Decay x0.5 every 2 steps.
  ExpertCache cache(lfu_config(2, 2.0, 0.5, 2));
  auto run_step = [&](const std::vector<Row>& rows) {
    for (size_t i = 0; i < rows.size(); ++i) check(cache, rows[i], static_cast<int>(i));
    return cache.end_step();
  };
  // Step 1. A=1 miss, A=2 hit, B=1 miss.                                     cache A B
  CHECK(run_step({{A, false, 0, kNone}, {A, true, 0, kNone}, {B, false, 1, kNone}}).empty());
  CHECK(cache.count(key(A)) == 2.0);  // step 1 ends: no decay (period 2)
  // Step 2. C=1: candidates A (2 >= 2); B (1) is below the threshold -> A.   cache C B
  //         C=2 hit, B=2 hit.
  run_step({{C, false, 0, A}, {C, true, 0, kNone}, {B, true, 1, kNone}});
  // Step 2 ends: counts halved, the evicted A's too: A 2 -> 1, B 2 -> 1, C 2 -> 1.
  CHECK(cache.count(key(A)) == 1.0);
  CHECK(cache.count(key(B)) == 1.0);
  CHECK(cache.count(key(C)) == 1.0);
  // Step 3. A=2: B=1, C=1 both below 2: no candidate, bypass. D=1: bypass.   cache C B
  run_step({{A, false, -1, kNone}, {D, false, -1, kNone}});
  CHECK(cache.cached() == keys({B, C}));
  CHECK(cache.count(key(A)) == 2.0);  // a bypass counts
  // Step 4. B=2 hit. A=3: candidates B (2); C (1) is not -> B.               cache C A
  run_step({{B, true, 1, kNone}, {A, false, 1, B}});
  // Step 4 ends: A 3 -> 1.5, B 2 -> 1, C 1 -> 0.5, D 1 -> 0.5.
  CHECK(cache.count(key(A)) == 1.5);
  CHECK(cache.count(key(B)) == 1.0);
  CHECK(cache.count(key(C)) == 0.5);
  CHECK(cache.count(key(D)) == 0.5);
  // Step 5. C=1.5 hit, C=2.5 hit. D=1.5: candidates C (2.5); A (1.5) is not -> C.  cache D A
  run_step({{C, true, 0, kNone}, {C, true, 0, kNone}, {D, false, 0, C}});
  CHECK(cache.cached() == keys({A, D}));
  CHECK(cache.steps() == 5);
  const auto& s = cache.stats();
  CHECK(s.accesses == 13);
  CHECK(s.hits == 6);
  CHECK(s.misses == 7);
  CHECK(s.bypasses == 2);
  CHECK(s.evictions == 3);
  CHECK(s.write_backs == 0);
}

TEST_CASE("cache: pinned entries are never evicted, all pinned is a bypass", "[cache]") {
  for (CachePolicy policy : {CachePolicy::lru, CachePolicy::lfu}) {
    INFO(offload::to_string(policy));
    CacheConfig config = policy == CachePolicy::lfu ? lfu_config(2, 0.0, 1.0, 1)
                                                    : CacheConfig{CachePolicy::lru, 2, 0, {}};
    ExpertCache cache(config);
    check(cache, {A, false, 0, kNone}, 0);
    check(cache, {A, true, 0, kNone}, 1);  // (lfu: A=2)
    check(cache, {B, false, 1, kNone}, 2);
    cache.pin(key(B));
    cache.pin(key(B));
    CHECK(cache.pins(key(B)) == 2);
    // lru would evict A (older), lfu B (count 1): with B pinned both evict A.
    check(cache, {C, false, 0, A}, 3);
    cache.pin(key(C));
    check(cache, {D, false, -1, kNone}, 4);  // every slot pinned: bypass
    cache.unpin(key(B));
    check(cache, {D, false, -1, kNone}, 5);  // B still pinned once
    cache.unpin(key(B));
    check(cache, {D, false, 1, B}, 6);
    CHECK(cache.stats().bypasses == 2);
    REQUIRE_THROWS_WITH(cache.unpin(key(D)),
                        Catch::Contains("layer 0 expert 3") && Catch::Contains("not pinned"));
    REQUIRE_THROWS_WITH(cache.pin(key(A)), Catch::Contains("pin of layer 0 expert 0") &&
                                               Catch::Contains("not cached"));
    REQUIRE_THROWS_AS(cache.mark_dirty(key(E)), Error);
  }
}

TEST_CASE("cache: dirty entries are written back on eviction and every flush period", "[cache]") {
  ExpertCache cache({CachePolicy::lru, 2, 2, {}});  // flush every 2 steps
  // Step 1: A (dirty), B.                                   cache A* B
  check(cache, {A, false, 0, kNone}, 0);
  cache.mark_dirty(key(A));
  check(cache, {B, false, 1, kNone}, 1);
  CHECK(cache.end_step().empty());  // step 1: no flush due
  // Step 2: A hit; C evicts B (clean), C dirty.             cache A* C*
  check(cache, {A, true, 0, kNone}, 2);
  check(cache, {C, false, 1, B, false}, 3);
  cache.mark_dirty(key(C));
  CHECK(cache.end_step() == keys({A, C}));  // step 2: flush, both now clean
  CHECK_FALSE(cache.dirty(key(A)));
  CHECK(cache.stats().write_backs == 2);
  // Step 3: A hit (dirty, pinned), C hit (dirty); D evicts C, the only unpinned entry: dirty.
  check(cache, {A, true, 0, kNone}, 4);
  cache.mark_dirty(key(A));
  cache.pin(key(A));
  check(cache, {C, true, 1, kNone}, 5);
  cache.mark_dirty(key(C));
  check(cache, {D, false, 1, C, true}, 6);  //   cache A* D
  CHECK(cache.stats().write_backs == 3);
  CHECK(cache.end_step().empty());  // step 3: no flush due
  // Step 4: flush due, but A is pinned: skipped, still dirty. D was never dirtied.
  CHECK(cache.end_step().empty());
  CHECK(cache.dirty(key(A)));
  cache.unpin(key(A));
  CHECK(cache.flush() == keys({A}));
  CHECK(cache.flush().empty());
  CHECK(cache.stats().write_backs == 4);
}

TEST_CASE("cache: Belady on a textbook sequence, with and without bypass", "[cache]") {
  // 7 0 1 2 0 3 0 4 2 3 0 3 2 1 2 0 1 7 0 1 with 3 entries: MIN (every miss admitted) takes the
  // textbook's 9 misses. With bypass: 2 evicts 7 (next 17), 3 evicts 1 (13), 4 and the second 7
  // are never used again and bypass, 1 (at 13) evicts 3 (never again): 8 misses.
  const std::vector<ExpertKey> seq =
      keys({7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1});
  CHECK(offload::belady_hits(seq, 3, false) == 11);
  CHECK(offload::belady_hits(seq, 3, true) == 12);
  CHECK(offload::belady_hits(seq, 20, true) == 20 - 6);  // only the 6 cold misses
  // One entry: admitting every miss, nothing repeats back to back; with bypass, keeping 0 (used
  // 6 times) throughout hits 5 times.
  CHECK(offload::belady_hits(seq, 1, false) == 0);
  CHECK(offload::belady_hits(seq, 1, true) == 5);
}

namespace {

// The optimum by exhaustive search over every admit/bypass/victim choice (keys < 8).
int exhaustive_hits(const std::vector<int>& seq, size_t i, unsigned cached, int capacity,
                    bool allow_bypass, std::map<std::pair<size_t, unsigned>, int>& memo) {
  if (i == seq.size()) return 0;
  auto found = memo.find({i, cached});
  if (found != memo.end()) return found->second;
  const unsigned bit = 1u << seq[i];
  int best = 0;
  if (cached & bit) {
    best = 1 + exhaustive_hits(seq, i + 1, cached, capacity, allow_bypass, memo);
  } else if (__builtin_popcount(cached) < capacity) {
    best = exhaustive_hits(seq, i + 1, cached | bit, capacity, allow_bypass, memo);
    if (allow_bypass)
      best = std::max(best, exhaustive_hits(seq, i + 1, cached, capacity, allow_bypass, memo));
  } else {
    if (allow_bypass) best = exhaustive_hits(seq, i + 1, cached, capacity, allow_bypass, memo);
    for (unsigned v = cached; v; v &= v - 1) {
      const unsigned victim = v & (~v + 1);
      best = std::max(best, exhaustive_hits(seq, i + 1, (cached & ~victim) | bit, capacity,
                                            allow_bypass, memo));
    }
  }
  memo[{i, cached}] = best;
  return best;
}

}  // namespace

TEST_CASE("cache: Belady equals the exhaustive optimum on random short sequences", "[cache]") {
  std::mt19937 rng(16);
  for (int trial = 0; trial < 300; ++trial) {
    const int distinct = 2 + trial % 5, capacity = 1 + trial % 3;
    std::vector<int> seq(static_cast<size_t>(6 + trial % 11));
    for (int& k : seq) k = static_cast<int>(rng() % static_cast<unsigned>(distinct));
    std::vector<ExpertKey> ks;
    for (int k : seq) ks.push_back(key(k));
    for (bool bypass : {false, true}) {
      INFO("trial " << trial << " bypass " << bypass);
      std::map<std::pair<size_t, unsigned>, int> memo;
      CHECK(offload::belady_hits(ks, capacity, bypass) ==
            exhaustive_hits(seq, 0, 0u, capacity, bypass, memo));
    }
  }
}

namespace {

// Random steps of skewed accesses over `layers` x `experts` keys (squared uniform: low ids are
// popular), half of each step's accesses writing.
offload::AccessSequence random_sequence(uint32_t seed, int layers, int experts, int steps,
                                        int per_step) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  offload::AccessSequence seq;
  seq.experts = layers * experts;
  for (int s = 0; s < steps; ++s) {
    seq.steps.emplace_back();
    for (int a = 0; a < per_step; ++a) {
      const double r = u(rng);
      seq.steps.back().push_back({{static_cast<int32_t>(rng() % static_cast<unsigned>(layers)),
                                   static_cast<int32_t>(r * r * experts)},
                                  a % 2 == 1});
    }
  }
  return seq;
}

}  // namespace

TEST_CASE("cache: Belady bounds LRU and LFU, a cache of every key only misses cold", "[cache]") {
  const offload::AccessSequence seq = random_sequence(7, 3, 10, 40, 12);
  const std::vector<ExpertKey> ks = seq.keys();
  std::vector<CacheConfig> configs;
  for (int64_t capacity : {1, 3, 8, 15, 30}) {
    configs.push_back({CachePolicy::lru, capacity, 3, {}});
    for (double threshold : {0.0, 1.0, 3.0})
      for (double beta : {1.0, 0.5}) configs.push_back(lfu_config(capacity, threshold, beta, 4));
  }
  for (const CacheConfig& c : configs) {
    INFO(offload::to_string(c.policy) << " capacity " << c.capacity << " threshold "
                                      << c.lfu.threshold << " beta " << c.lfu.beta);
    const offload::Simulation sim = offload::simulate(c, seq);
    const int64_t optimum = offload::belady_hits(ks, c.capacity, true);
    CHECK(sim.stats.accesses == static_cast<int64_t>(ks.size()));
    CHECK(sim.stats.hits + sim.stats.misses == sim.stats.accesses);
    CHECK(sim.stats.hits <= optimum);
    if (c.policy == CachePolicy::lru) {
      CHECK(sim.stats.hits <= offload::belady_hits(ks, c.capacity, false));
      CHECK(sim.stats.bypasses == 0);
      CHECK(sim.uncached_writes == 0);
    }
    CHECK(offload::belady_hits(ks, c.capacity, false) <= optimum);
  }
  // 30 keys possible: a cache of 30 misses each distinct key once, whatever the policy.
  std::vector<ExpertKey> distinct = ks;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const int64_t cold = static_cast<int64_t>(distinct.size());
  REQUIRE(cold > 10);
  for (const CacheConfig& c : configs) {
    if (c.capacity < 30) continue;
    const offload::Simulation sim = offload::simulate(c, seq);
    CHECK(sim.stats.misses == cold);
    CHECK(sim.stats.evictions == 0);
    CHECK(sim.stats.bypasses == 0);
  }
  CHECK(offload::belady_hits(ks, 30, true) == static_cast<int64_t>(ks.size()) - cold);
  CHECK(offload::belady_hits(ks, 30, false) == static_cast<int64_t>(ks.size()) - cold);
}

TEST_CASE("cache: simulate marks written entries dirty and counts uncached writes", "[cache]") {
  // Capacity 1, lfu threshold 2: B's first access bypasses (A has count 1 < 2).
  offload::AccessSequence seq;
  seq.experts = 2;
  seq.steps = {{{key(A), true}, {key(B), true}}, {{key(A), false}, {key(B), false}}};
  // Step 1: A=1 admitted (dirty), B=1 bypass (an uncached write). Step 2: A=2 hit; B=2: A (2) is
  // a candidate and dirty: evicted, written back.
  const offload::Simulation sim = offload::simulate(lfu_config(1, 2.0, 1.0, 1), seq);
  CHECK(sim.stats.hits == 1);
  CHECK(sim.stats.bypasses == 1);
  CHECK(sim.stats.evictions == 1);
  CHECK(sim.stats.write_backs == 1);
  CHECK(sim.uncached_writes == 1);
}

TEST_CASE("cache: the training access order from a routing trace", "[cache]") {
  // 2 MoE layers of 4 experts, top-1; 3 batches, the first two one accumulated step.
  io::TraceInfo info;
  info.model_config = {{"arch", "gpt"}};
  info.top_k = 1;
  info.moe_blocks = {0, 1};
  info.experts = {4, 4};
  info.source = "train";
  // Tokens' experts per layer: batch 0: (2, 1) (0, 1); batch 1: (3, 0); batch 2: (1, 3) (1, 2).
  const std::vector<std::vector<std::pair<int, int>>> routes = {
      {{2, 1}, {0, 1}}, {{3, 0}}, {{1, 3}, {1, 2}}};
  const std::vector<int64_t> steps = {5, 5, 6};
  test::ScratchDir dir("cache-trace");
  const std::string path = dir / "trace.h5";
  {
    io::TraceWriter w(path, info, 4);
    for (size_t b = 0; b < routes.size(); ++b) {
      io::TraceBatch batch;
      batch.step = steps[b];
      batch.loads.assign(8, 0);
      batch.dropped.assign(2, 0);
      for (auto [e0, e1] : routes[b]) {
        batch.token_ids.push_back(65);
        batch.experts.insert(batch.experts.end(), {e0, e1});
        batch.gates.insert(batch.gates.end(), {1.0f, 1.0f});
        batch.loads[static_cast<size_t>(e0)]++;
        batch.loads[static_cast<size_t>(4 + e1)]++;
      }
      w.append(batch);
    }
    w.close();
  }
  io::TraceReader trace(path);
  const offload::AccessSequence seq = offload::training_accesses(trace);
  CHECK(seq.experts == 8);
  auto k = [](int layer, int expert, bool writes) {
    return offload::Access{{layer, expert}, writes};
  };
  const std::vector<std::vector<offload::Access>> expected = {
      // step 5, batch 0: forward L0 {0, 2}, L1 {1}; backward L1 {1}, L0 {0, 2}; then batch 1
      {k(0, 0, false), k(0, 2, false), k(1, 1, false), k(1, 1, true), k(0, 0, true), k(0, 2, true),
       k(0, 3, false), k(1, 0, false), k(1, 0, true), k(0, 3, true)},
      // step 6, batch 2: forward L0 {1}, L1 {2, 3}; backward L1 {2, 3}, L0 {1}
      {k(0, 1, false), k(1, 2, false), k(1, 3, false), k(1, 2, true), k(1, 3, true),
       k(0, 1, true)}};
  REQUIRE(seq.steps.size() == expected.size());
  for (size_t s = 0; s < expected.size(); ++s) {
    REQUIRE(seq.steps[s].size() == expected[s].size());
    for (size_t i = 0; i < expected[s].size(); ++i) {
      INFO("step " << s << " access " << i);
      CHECK(seq.steps[s][i].key == expected[s][i].key);
      CHECK(seq.steps[s][i].writes == expected[s][i].writes);
    }
  }
  CHECK(seq.accesses() == 16);
}

TEST_CASE("cache: bad configurations name the flag", "[cache]") {
  auto refused = [](const CacheConfig& c, const std::string& needle) {
    INFO(needle);
    REQUIRE_THROWS_AS(ExpertCache(c), UsageError);
    REQUIRE_THROWS_WITH(ExpertCache(c), Catch::Contains(needle));
  };
  refused({CachePolicy::lru, 0, 0, {}}, "--host-budget");
  refused({CachePolicy::lru, -3, 0, {}}, "capacity -3");
  refused({CachePolicy::lru, 4, -1, {}}, "flush period -1");
  refused(lfu_config(4, 0.0, 0.0, 1), "--lfu-beta 0");
  refused(lfu_config(4, 0.0, 1.5, 1), "--lfu-beta 1.5");
  refused(lfu_config(4, 0.0, -0.5, 1), "--lfu-beta");
  refused(lfu_config(4, 0.0, 0.5, 0), "--lfu-period 0");
  refused(lfu_config(4, -1.0, 0.5, 1), "--lfu-threshold -1");
  refused(lfu_config(4, std::nan(""), 0.5, 1), "--lfu-threshold");
  REQUIRE_NOTHROW(ExpertCache(lfu_config(1, 0.0, 1.0, 1)));  // the edges are valid
  CHECK(offload::parse_cache_policy("lfu") == CachePolicy::lfu);
  CHECK(offload::parse_cache_policy("lru") == CachePolicy::lru);
  REQUIRE_THROWS_WITH(offload::parse_cache_policy("lfru"),
                      Catch::Contains("--expert-cache 'lfru'"));
  REQUIRE_THROWS_AS(offload::belady_hits(keys({A}), 0), UsageError);
}

TEST_CASE("cache: erase frees its slot for the next admission, never a pinned entry", "[cache]") {
  ExpertCache cache({CachePolicy::lru, 3, 0, {}});
  const std::vector<Row> fill = {
      {A, false, 0, kNone},  // A - -
      {B, false, 1, kNone},  // A B -
      {C, false, 2, kNone},  // A B C
  };
  for (size_t i = 0; i < fill.size(); ++i) check(cache, fill[i], static_cast<int>(i));
  cache.mark_dirty(key(B));
  cache.erase(key(B));  // A - C: dropped without a write-back
  CHECK_FALSE(cache.contains(key(B)));
  CHECK(cache.size() == 2);
  CHECK(cache.stats().write_backs == 0);
  // The freed middle slot is taken before any eviction; then the cache is full again.
  check(cache, {D, false, 1, kNone}, 3);  // A D C
  check(cache, {E, false, 0, A}, 4);      // E D C
  cache.pin(key(D));
  REQUIRE_THROWS_WITH(cache.erase(key(D)), Catch::Contains("pinned"));
  REQUIRE_THROWS_WITH(cache.erase(key(A)), Catch::Contains("layer 0 expert 0"));
}

TEST_CASE("cache: admit places a prefetch without counting it or touching recency", "[cache]") {
  CacheConfig config;
  config.capacity = 2;
  ExpertCache cache(config);
  const ExpertKey a{0, 0}, b{0, 1}, c{1, 0}, d{1, 1};
  cache.access(a);
  cache.access(b);
  // c is admitted in place of the least recent (a), and nothing is counted.
  Lookup r = cache.admit(c);
  REQUIRE(!r.hit);
  REQUIRE(r.evicted == a);
  REQUIRE(cache.stats().accesses == 2);
  REQUIRE(cache.stats().evictions == 0);
  REQUIRE(cache.count(c) == 0);
  REQUIRE(cache.access(c).hit);  // its use
  REQUIRE(cache.stats().hits == 1);
  // Admitting a cached key is a hit that leaves its recency alone: b stays the least recent.
  REQUIRE(cache.admit(b).hit);
  r = cache.access(d);
  REQUIRE(r.evicted == b);
}
