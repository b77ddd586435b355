// Expert placement of checkpoint conversions (see moe/io/convert.h): contiguous, round-robin and
// LPT placements, rank loads, and the per-layer plan from a routing trace. Shape letters: E
// experts of a layer, L MoE layers, N ranks.

#include <algorithm>
#include <numeric>

#include "io/convert_internal.h"
#include "moe/io/convert.h"
#include "moe/profile/summary.h"

namespace moe::io {

// ---- placement --------------------------------------------------------------------------------

int64_t per_rank(int64_t experts, int ranks) {
  MOE_USAGE_CHECK(ranks >= 1, "--ranks must be >= 1 (got ", ranks, ")");
  MOE_USAGE_CHECK(experts % ranks == 0, ranks, " ranks do not divide a layer of ", experts,
                  " experts (each rank holds E/N experts of every MoE layer)");
  return experts / ranks;
}

std::vector<int> contiguous_placement(int64_t experts, int ranks) {
  const int64_t n = per_rank(experts, ranks);
  std::vector<int> map(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) map[static_cast<size_t>(e)] = static_cast<int>(e / n);
  return map;
}

std::vector<int> round_robin_placement(int64_t experts, int ranks) {
  per_rank(experts, ranks);
  std::vector<int> map(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) map[static_cast<size_t>(e)] = static_cast<int>(e % ranks);
  return map;
}

std::vector<int> lpt_placement(const std::vector<int64_t>& loads, int ranks) {
  const int64_t experts = static_cast<int64_t>(loads.size());
  const int64_t room = per_rank(experts, ranks);
  std::vector<int64_t> order(loads.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return loads[static_cast<size_t>(a)] > loads[static_cast<size_t>(b)];
  });
  std::vector<int64_t> load(static_cast<size_t>(ranks), 0), held(static_cast<size_t>(ranks), 0);
  std::vector<int> map(loads.size(), -1);
  for (int64_t e : order) {
    int best = -1;
    for (int r = 0; r < ranks; ++r) {
      if (held[static_cast<size_t>(r)] >= room) continue;
      if (best < 0 || load[static_cast<size_t>(r)] < load[static_cast<size_t>(best)]) best = r;
    }
    map[static_cast<size_t>(e)] = best;
    load[static_cast<size_t>(best)] += loads[static_cast<size_t>(e)];
    ++held[static_cast<size_t>(best)];
  }
  return map;
}

std::vector<int64_t> rank_loads(const std::vector<int64_t>& loads, const std::vector<int>& map,
                                int ranks) {
  MOE_CHECK(loads.size() == map.size(), "rank_loads: ", loads.size(), " loads, ", map.size(),
            " experts placed");
  std::vector<int64_t> out(static_cast<size_t>(ranks), 0);
  for (size_t e = 0; e < map.size(); ++e) out.at(static_cast<size_t>(map[e])) += loads[e];
  return out;
}

double max_over_mean(const std::vector<int64_t>& loads) {
  if (loads.empty()) return 0;
  const int64_t total = std::accumulate(loads.begin(), loads.end(), int64_t{0});
  if (total == 0) return 0;
  const double mean = static_cast<double>(total) / static_cast<double>(loads.size());
  return static_cast<double>(*std::max_element(loads.begin(), loads.end())) / mean;
}

bool is_contiguous_placement(const std::vector<int>& map, int ranks) {
  if (ranks < 1 || map.size() % static_cast<size_t>(ranks) != 0) return false;
  return map == contiguous_placement(static_cast<int64_t>(map.size()), ranks);
}

std::vector<LayerPlacement> plan_placement(const ModelConfig& model, const TraceReader& trace,
                                           int ranks) {
  const TraceInfo& info = trace.info();
  std::vector<int64_t> blocks, experts;
  for (size_t b = 0; b < model.experts_per_layer.size(); ++b)
    if (model.experts_per_layer[b] > 0) {
      blocks.push_back(static_cast<int64_t>(b));
      experts.push_back(model.experts_per_layer[b]);
    }
  const int64_t top_k = model.residual_moe ? 1 : model.top_k;
  auto list = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(v[i]);
    }
    return "[" + s + "]";
  };
  if (info.moe_blocks != blocks || info.experts != experts || info.top_k != top_k)
    throw Error(str("trace '", trace.name(), "' does not come from this model: its MoE blocks ",
                    list(info.moe_blocks), " with experts ", list(info.experts), ", top-",
                    info.top_k, "; the checkpoint's MoE blocks ", list(blocks), " with experts ",
                    list(experts), ", top-", top_k));
  std::vector<profile::LayerSummary> summary = profile::summarize(trace);
  std::vector<LayerPlacement> out;
  for (size_t l = 0; l < summary.size(); ++l) {
    LayerPlacement p;
    p.layer = static_cast<int64_t>(l);
    p.block = blocks[l];
    p.experts = experts[l];
    p.loads = summary[l].counts;
    p.loads.resize(static_cast<size_t>(p.experts), 0);
    p.lpt = lpt_placement(p.loads, ranks);
    p.contiguous = contiguous_placement(p.experts, ranks);
    p.round_robin = round_robin_placement(p.experts, ranks);
    p.lpt_max_over_mean = max_over_mean(rank_loads(p.loads, p.lpt, ranks));
    p.contiguous_max_over_mean = max_over_mean(rank_loads(p.loads, p.contiguous, ranks));
    p.round_robin_max_over_mean = max_over_mean(rank_loads(p.loads, p.round_robin, ranks));
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace moe::io
