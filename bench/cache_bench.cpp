// moe-cache-bench: hit rates of the tiered expert store's host cache policies
// (offload::ExpertCache: LRU and MoESys's LFU variant) on a real routing trace (moe-train --trace),
// against the offline optimum of the same access sequence (Belady with bypass, the ceiling;
// Belady's MIN, which admits every miss, beside it). The access sequence is the training store's
// (offload::training_accesses): per batch, forward over the MoE layers in order, backward in
// reverse, the experts that received tokens in each. Cache sizes are fractions of all experts of
// all MoE layers. Not a timing benchmark: every number is a count, exact and machine-independent.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "common/cli.h"
#include "machine.h"
#include "moe/error.h"
#include "moe/io/trace.h"
#include "moe/offload/cache_sim.h"

using namespace moe;

namespace {

struct Options {
  std::string trace;
  std::vector<double> sizes = {10, 25, 50, 75};
  std::vector<std::string> lfu = {"0:0.75:16", "0:0.5:16", "0:1:1", "2:0.75:16"};
  int64_t flush_period = 0;
};

offload::LfuConfig parse_lfu(const std::string& text) {
  offload::LfuConfig c;
  std::istringstream in(text);
  char colon1 = 0, colon2 = 0;
  in >> c.threshold >> colon1 >> c.beta >> colon2 >> c.period;
  MOE_USAGE_CHECK(in && colon1 == ':' && colon2 == ':' && in.peek() == EOF, "--lfu '", text,
                  "': expected THRESHOLD:BETA:PERIOD, e.g. 0:0.75:16");
  return c;
}

struct Row {
  std::string policy;
  int64_t hits = 0, misses = 0, bypasses = 0, evictions = 0, writes = 0;
};

int run(const Options& o) {
  std::vector<offload::LfuConfig> lfus;
  for (const std::string& s : o.lfu) {
    lfus.push_back(parse_lfu(s));
    // Refused before any output, not when the first row gets to it.
    offload::CacheConfig{offload::CachePolicy::lfu, 1, o.flush_period, lfus.back()}.validate();
  }
  for (double s : o.sizes)
    MOE_USAGE_CHECK(s > 0 && s <= 100, "--sizes ", s, ": a cache size is a percentage in (0, 100]");
  io::TraceReader trace(o.trace);
  const offload::AccessSequence seq = offload::training_accesses(trace);
  const std::vector<offload::ExpertKey> keys = seq.keys();
  MOE_USAGE_CHECK(!keys.empty(), o.trace, ": the trace has no expert accesses");
  std::vector<offload::ExpertKey> distinct = keys;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const io::TraceInfo& info = trace.info();
  const double steps = static_cast<double>(seq.steps.size());
  const double accesses = static_cast<double>(keys.size());

  std::printf(
      "# moe-cache-bench: expert cache hit rates, LRU and MoESys's LFU variant against the "
      "offline optimum\n");
  std::printf("# %s, %s\n", bench::now_utc().c_str(), bench::cpu_model().c_str());
  std::string experts;
  for (size_t l = 0; l < info.experts.size(); ++l)
    experts += (l ? "," : "") + std::to_string(info.experts[l]);
  std::printf(
      "# trace: %s (source %s, arch %s), %lld MoE layers, experts per layer %s (%lld in all), "
      "top-%lld, %lld batches, %lld tokens\n",
      o.trace.c_str(), info.source.c_str(), info.model_config.value("arch", "?").c_str(),
      static_cast<long long>(trace.layers()), experts.c_str(), static_cast<long long>(seq.experts),
      static_cast<long long>(info.top_k), static_cast<long long>(trace.batches()),
      static_cast<long long>(trace.tokens()));
  std::printf(
      "# access order per batch: forward layer 0..L-1, then backward L-1..0; in each layer the "
      "experts that received tokens, ascending; backward accesses write (dirty)\n");
  std::printf(
      "# accesses: %lld in %lld steps (%.1f per step, %.1f%% of the experts touched per step "
      "and pass), %lld distinct keys (the cold misses)\n",
      static_cast<long long>(keys.size()), static_cast<long long>(seq.steps.size()),
      accesses / steps, 100.0 * accesses / steps / 2.0 / static_cast<double>(seq.experts),
      static_cast<long long>(distinct.size()));
  std::printf(
      "# belady = offline optimum that may decline to admit (the ceiling); min = Belady's MIN "
      "(every miss admitted); lfu T/B/K = --lfu-threshold T --lfu-beta B --lfu-period K\n");
  std::printf(
      "# ratio = hits / belady hits; reads = misses per step (expert reads from the SSD tier); "
      "writes = (dirty write-backs + uncached writes) per step; flush period %lld steps%s\n",
      static_cast<long long>(o.flush_period),
      o.flush_period == 0 ? " (write-back on eviction only)" : "");
  const offload::LfuConfig defaults;
  std::printf("# lfu defaults: --lfu-threshold %g --lfu-beta %g --lfu-period %lld\n",
              defaults.threshold, defaults.beta, static_cast<long long>(defaults.period));
  std::printf("# check: hits + misses = accesses, hits <= belady, min <= belady\n#\n");
  std::printf("# %5s %7s  %-16s %9s %9s %8s %8s %8s %7s %8s %8s %6s\n", "cache", "entries",
              "policy", "hits", "misses", "bypass", "evict", "hit_rate", "ratio", "reads", "writes",
              "check");
  std::printf("# %5s %7s  %-16s %9s %9s %8s %8s %8s %7s %8s %8s %6s\n", "(%)", "", "", "", "", "",
              "", "(%)", "(%)", "(/step)", "(/step)", "");

  bool all_ok = true;
  for (double size : o.sizes) {
    const int64_t capacity =
        std::max<int64_t>(1, std::llround(size / 100.0 * static_cast<double>(seq.experts)));
    const int64_t ceiling = offload::belady_hits(keys, capacity, true);
    std::vector<Row> rows;
    auto simulated = [&](const std::string& name, const offload::CacheConfig& c) {
      const offload::Simulation sim = offload::simulate(c, seq);
      rows.push_back({name, sim.stats.hits, sim.stats.misses, sim.stats.bypasses,
                      sim.stats.evictions, sim.stats.write_backs + sim.uncached_writes});
    };
    offload::CacheConfig lru{offload::CachePolicy::lru, capacity, o.flush_period, {}};
    simulated("lru", lru);
    for (const offload::LfuConfig& l : lfus) {
      char name[64];
      std::snprintf(name, sizeof name, "lfu %g/%g/%lld", l.threshold, l.beta,
                    static_cast<long long>(l.period));
      simulated(name, {offload::CachePolicy::lfu, capacity, o.flush_period, l});
    }
    const int64_t min_hits = offload::belady_hits(keys, capacity, false);
    rows.push_back({"min", min_hits, static_cast<int64_t>(keys.size()) - min_hits, 0, 0, -1});
    rows.push_back({"belady", ceiling, static_cast<int64_t>(keys.size()) - ceiling, 0, 0, -1});
    for (const Row& r : rows) {
      const bool ok = r.hits + r.misses == static_cast<int64_t>(keys.size()) && r.hits <= ceiling;
      all_ok = all_ok && ok;
      char writes[32] = "-";
      if (r.writes >= 0) std::snprintf(writes, sizeof writes, "%.1f", r.writes / steps);
      char bypass[32] = "-", evict[32] = "-";
      if (r.policy != "min" && r.policy != "belady") {
        std::snprintf(bypass, sizeof bypass, "%lld", static_cast<long long>(r.bypasses));
        std::snprintf(evict, sizeof evict, "%lld", static_cast<long long>(r.evictions));
      }
      std::printf("  %5g %7lld  %-16s %9lld %9lld %8s %8s %8.2f %7.1f %8.1f %8s %6s\n", size,
                  static_cast<long long>(capacity), r.policy.c_str(),
                  static_cast<long long>(r.hits), static_cast<long long>(r.misses), bypass, evict,
                  100.0 * r.hits / accesses, ceiling > 0 ? 100.0 * r.hits / ceiling : 100.0,
                  r.misses / steps, writes, ok ? "ok" : "FAIL");
    }
  }
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "moe-cache-bench: hit rates of the expert cache policies (LRU, MoESys LFU) against the "
      "offline optimum (Belady) on a routing trace from moe-train --trace",
      "moe-cache-bench"};
  Options o;
  app.add_option("trace", o.trace, "Routing trace (HDF5) written by moe-train --trace")->required();
  app.add_option("--sizes", o.sizes,
                 "Cache sizes, percent of all experts of all MoE layers (rounded, at least 1)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--lfu", o.lfu,
                 "LFU settings to compare, THRESHOLD:BETA:PERIOD each (--lfu-threshold, "
                 "--lfu-beta, --lfu-period)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--flush-period", o.flush_period,
                 "Steps between flushes of the dirty entries (0 = write back on eviction only)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  return tools::run_tool("moe-cache-bench", app, argc, argv, [&] { return run(o); });
}
