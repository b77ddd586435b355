// Expert placement policies (see moe/balance/placement.h). Shape letters: E experts of a layer,
// N (or P, R) ranks.
#include "moe/balance/placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "moe/error.h"

namespace moe::balance {

// ---- ExpertAssignment -------------------------------------------------------------------------

ExpertAssignment ExpertAssignment::contiguous(int64_t experts, int ranks) {
  MOE_CHECK(ranks > 0 && experts % ranks == 0, experts, " experts do not divide over ", ranks,
            " ranks");
  ExpertAssignment a;
  a.replicas.resize(static_cast<size_t>(experts));
  const int64_t per = experts / ranks;
  for (int64_t e = 0; e < experts; ++e)
    a.replicas[static_cast<size_t>(e)] = {static_cast<int32_t>(e / per)};
  return a;
}

std::vector<int64_t> ExpertAssignment::rank_rows(
    const std::vector<std::vector<int64_t>>& counts) const {
  int32_t ranks = 0;
  for (const auto& reps : replicas)
    for (int32_t p : reps) ranks = std::max(ranks, p + 1);
  ranks = std::max(ranks, static_cast<int32_t>(counts.size()));
  std::vector<int64_t> rows(static_cast<size_t>(ranks), 0);
  for (size_t s = 0; s < counts.size(); ++s) {
    MOE_CHECK(counts[s].size() == replicas.size(), "rank_rows: ", counts[s].size(), " counts for ",
              replicas.size(), " experts");
    for (size_t e = 0; e < replicas.size(); ++e) {
      const auto n = static_cast<int64_t>(replicas[e].size());
      for (int64_t j = 0; j < n; ++j) {
        const int32_t p = replicas[e][static_cast<size_t>((j + static_cast<int64_t>(s)) % n)];
        rows[static_cast<size_t>(p)] +=
            split_begin(counts[s][e], n, j + 1) - split_begin(counts[s][e], n, j);
      }
    }
  }
  return rows;
}

// ---- static placements -----------------------------------------------------------------------

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

// ---- Lina's packing ----------------------------------------------------------------------------

ExpertAssignment pack_experts(const std::vector<double>& popularity, int ranks) {
  MOE_CHECK(ranks >= 1 && !popularity.empty(), "pack_experts: ", popularity.size(), " experts on ",
            ranks, " ranks");
  const auto E = static_cast<int64_t>(popularity.size());
  double total = 0;
  for (double p : popularity) {
    MOE_CHECK(p >= 0 && std::isfinite(p), "pack_experts: popularity ", p, " is not >= 0");
    total += p;
  }
  std::vector<double> share(static_cast<size_t>(E), 1.0 / double(E));
  if (total > 0)
    for (int64_t e = 0; e < E; ++e) share[static_cast<size_t>(e)] = popularity[e] / total;
  struct Piece {
    int64_t expert;
    double size;
  };
  std::vector<Piece> pieces;
  for (int64_t e = 0; e < E; ++e) {
    const double s = share[static_cast<size_t>(e)];
    const int64_t n = std::clamp<int64_t>(std::llround(double(ranks) * s), 1, ranks);
    for (int64_t j = 0; j < n; ++j) pieces.push_back({e, s / double(n)});
  }
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const Piece& a, const Piece& b) { return a.size > b.size; });
  const double capacity = 1.0 / double(ranks) * (1 + 1e-9);
  std::vector<double> load(static_cast<size_t>(ranks), 0.0);
  ExpertAssignment a;
  a.replicas.resize(static_cast<size_t>(E));
  for (const Piece& piece : pieces) {
    std::vector<int32_t>& reps = a.replicas[static_cast<size_t>(piece.expert)];
    auto holds = [&](int p) { return std::find(reps.begin(), reps.end(), p) != reps.end(); };
    int chosen = -1;
    for (int p = 0; p < ranks && chosen < 0; ++p)  // first fit
      if (!holds(p) && load[static_cast<size_t>(p)] + piece.size <= capacity) chosen = p;
    if (chosen < 0)  // nothing fits: the least-loaded rank without this expert
      for (int p = 0; p < ranks; ++p)
        if (!holds(p) &&
            (chosen < 0 || load[static_cast<size_t>(p)] < load[static_cast<size_t>(chosen)]))
          chosen = p;
    load[static_cast<size_t>(chosen)] += piece.size;
    reps.push_back(static_cast<int32_t>(chosen));
  }
  return a;
}

}  // namespace moe::balance
