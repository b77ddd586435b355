// Expert placement policies (see moe/balance/placement.h). Shape letters: E experts of a layer,
// N (or P, R) ranks.
#include "moe/balance/placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "moe/error.h"
#include "moe/settings.h"

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
  MOE_USAGE_CHECK(ranks >= 1, flag_for(Setting::ranks), " must be >= 1 (got ", ranks, ")");
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

namespace {

// Graham's LPT, the one loop behind both LPT placements: items by key descending (ties: lower id),
// each to the rank with room minimising load_r + time(item, r) (ties: lower rank). room <= 0: no
// cap. With time independent of r this is "the least-loaded rank", as Graham's rule.
template <class T, class Time>
std::vector<int> lpt_assign(const std::vector<T>& key, int ranks, int64_t room, Time time,
                            std::vector<T>& load) {
  std::vector<int64_t> order(key.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return key[static_cast<size_t>(a)] > key[static_cast<size_t>(b)];
  });
  load.assign(static_cast<size_t>(ranks), T{0});
  std::vector<int64_t> held(static_cast<size_t>(ranks), 0);
  std::vector<int> map(key.size(), -1);
  for (int64_t e : order) {
    int best = -1;
    T best_finish{};
    for (int r = 0; r < ranks; ++r) {
      if (room > 0 && held[static_cast<size_t>(r)] >= room) continue;
      const T finish = load[static_cast<size_t>(r)] + time(e, r);
      if (best < 0 || finish < best_finish) {
        best = r;
        best_finish = finish;
      }
    }
    map[static_cast<size_t>(e)] = best;
    load[static_cast<size_t>(best)] = best_finish;
    ++held[static_cast<size_t>(best)];
  }
  return map;
}

}  // namespace

std::vector<int> lpt_placement(const std::vector<int64_t>& loads, int ranks) {
  const int64_t room = per_rank(static_cast<int64_t>(loads.size()), ranks);
  std::vector<int64_t> load;
  return lpt_assign(
      loads, ranks, room, [&](int64_t e, int) { return loads[static_cast<size_t>(e)]; }, load);
}

double processing_s(double compute_s, double upload_s, UploadOverlap overlap) {
  return overlap == UploadOverlap::max ? std::max(compute_s, upload_s) : compute_s + upload_s;
}

BatchLptPlacement lpt_batch_placement(const BatchLptInput& in, int ranks) {
  MOE_USAGE_CHECK(ranks >= 1, "LPT placement: ranks must be >= 1 (got ", ranks, ")");
  const size_t E = in.compute_s.size();
  MOE_CHECK(in.upload_s.size() == E, "LPT placement: ", in.upload_s.size(), " upload times for ", E,
            " experts");
  MOE_CHECK(in.resident.empty() || in.resident.size() == E, "LPT placement: ", in.resident.size(),
            " resident ranks for ", E, " experts");
  std::vector<double> key(E);
  for (size_t e = 0; e < E; ++e) {
    MOE_CHECK(in.compute_s[e] >= 0 && std::isfinite(in.compute_s[e]) && in.upload_s[e] >= 0 &&
                  std::isfinite(in.upload_s[e]),
              "LPT placement: expert ", e, " has compute ", in.compute_s[e], " s and upload ",
              in.upload_s[e], " s; times must be finite and >= 0");
    MOE_CHECK(in.resident.empty() || (in.resident[e] >= -1 && in.resident[e] < ranks),
              "LPT placement: expert ", e, " is resident on rank ", in.resident[e],
              ", outside [0, ", ranks, ") (-1: none)");
    key[e] = processing_s(in.compute_s[e], in.upload_s[e], in.overlap);
  }
  auto time = [&](int64_t e, int r) {
    const auto i = static_cast<size_t>(e);
    const bool here = !in.resident.empty() && in.resident[i] == r;
    return here ? processing_s(in.compute_s[i], 0, in.overlap) : key[i];
  };
  BatchLptPlacement out;
  out.rank_of_expert = lpt_assign(key, ranks, 0, time, out.rank_s);
  out.makespan_s = *std::max_element(out.rank_s.begin(), out.rank_s.end());
  return out;
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
