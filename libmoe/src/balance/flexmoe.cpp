// FlexMoE's planning core (see moe/balance/flexmoe.h): vExpert map, flexible routing, cost model,
// greedy policy maker. Shape letters: R ranks, V slots per rank, E experts.
#include "moe/balance/flexmoe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "moe/error.h"
#include "moe/settings.h"

namespace moe::balance {

namespace {

size_t idx(int64_t i) { return static_cast<size_t>(i); }

void check_tokens(const TokenMatrix& tokens, int ranks, int64_t experts) {
  MOE_CHECK(static_cast<int64_t>(tokens.size()) == ranks, "token matrix has ", tokens.size(),
            " rows for ", ranks, " ranks (one row per source rank)");
  for (size_t s = 0; s < tokens.size(); ++s) {
    MOE_CHECK(static_cast<int64_t>(tokens[s].size()) == experts, "token matrix row ", s, " has ",
              tokens[s].size(), " entries for ", experts, " experts");
    for (size_t e = 0; e < tokens[s].size(); ++e)
      MOE_CHECK(tokens[s][e] >= 0, "token matrix: rank ", s, " sends ", tokens[s][e],
                " tokens to expert ", e, " (counts must be >= 0)");
  }
}

}  // namespace

// ---- VExpertMap -------------------------------------------------------------------------------

VExpertMap::VExpertMap(int ranks, int slots_per_rank, int64_t experts)
    : ranks_(ranks), slots_per_rank_(slots_per_rank), experts_(experts) {
  MOE_USAGE_CHECK(ranks >= 1, "vExpert map: ranks must be >= 1 (got ", ranks, ")");
  MOE_USAGE_CHECK(slots_per_rank >= 1, "vExpert map: ", flag_for(Setting::vexperts_per_rank),
                  " must be >= 1 (got ", slots_per_rank, ")");
  MOE_USAGE_CHECK(experts >= 1, "vExpert map: experts must be >= 1 (got ", experts, ")");
  MOE_USAGE_CHECK(static_cast<int64_t>(ranks) * slots_per_rank >= experts, "vExpert map: ", ranks,
                  " ranks x ", slots_per_rank, " slots cannot hold ", experts, " experts; raise ",
                  flag_for(Setting::vexperts_per_rank), " to at least ",
                  (experts + ranks - 1) / ranks);
  slots_.assign(idx(static_cast<int64_t>(ranks) * slots_per_rank), kEmpty);
}

VExpertMap VExpertMap::contiguous(int ranks, int slots_per_rank, int64_t experts) {
  VExpertMap map(ranks, slots_per_rank, experts);
  const int64_t per = (experts + ranks - 1) / ranks;  // <= V since R*V >= E
  for (int64_t e = 0; e < experts; ++e)
    map.slots_[idx((e / per) * slots_per_rank + e % per)] = static_cast<int32_t>(e);
  map.validate();
  return map;
}

VExpertMap VExpertMap::from_slots(int ranks, int slots_per_rank, int64_t experts,
                                  std::vector<int32_t> slots) {
  VExpertMap map(ranks, slots_per_rank, experts);
  MOE_CHECK(slots.size() == map.slots_.size(), "vExpert map: ", slots.size(), " slots given for ",
            ranks, " ranks x ", slots_per_rank, " slots");
  map.slots_ = std::move(slots);
  map.validate();
  return map;
}

int32_t VExpertMap::slot(int rank, int v) const {
  MOE_CHECK(rank >= 0 && rank < ranks_ && v >= 0 && v < slots_per_rank_, "vExpert map: slot ", v,
            " of rank ", rank, " is outside ", ranks_, " ranks x ", slots_per_rank_, " slots");
  return slots_[idx(static_cast<int64_t>(rank) * slots_per_rank_ + v)];
}

bool VExpertMap::holds(int rank, int64_t expert) const {
  for (int v = 0; v < slots_per_rank_; ++v)
    if (slot(rank, v) == expert) return true;
  return false;
}

std::vector<int32_t> VExpertMap::holders(int64_t expert) const {
  std::vector<int32_t> out;
  for (int r = 0; r < ranks_; ++r)
    if (holds(r, expert)) out.push_back(r);
  return out;
}

int64_t VExpertMap::replicas(int64_t expert) const {
  return static_cast<int64_t>(holders(expert).size());
}

int VExpertMap::free_slots(int rank) const {
  int n = 0;
  for (int v = 0; v < slots_per_rank_; ++v) n += slot(rank, v) == kEmpty;
  return n;
}

void VExpertMap::add_replica(int rank, int64_t expert) {
  MOE_CHECK(expert >= 0 && expert < experts_, "vExpert map: expert ", expert, " is outside [0, ",
            experts_, ")");
  MOE_CHECK(!holds(rank, expert), "vExpert map: rank ", rank, " already holds expert ", expert,
            " (replicas of one expert on one rank are not allowed)");
  for (int v = 0; v < slots_per_rank_; ++v) {
    int32_t& s = slots_[idx(static_cast<int64_t>(rank) * slots_per_rank_ + v)];
    if (s == kEmpty) {
      s = static_cast<int32_t>(expert);
      return;
    }
  }
  MOE_CHECK(false, "vExpert map: rank ", rank, " has no free slot for expert ", expert, " (all ",
            slots_per_rank_, " hold experts)");
}

void VExpertMap::remove_replica(int rank, int64_t expert) {
  MOE_CHECK(holds(rank, expert), "vExpert map: rank ", rank, " holds no replica of expert ",
            expert);
  MOE_CHECK(replicas(expert) >= 2, "vExpert map: the replica of expert ", expert, " on rank ", rank,
            " is its last one; every expert keeps at least one");
  for (int v = 0; v < slots_per_rank_; ++v) {
    int32_t& s = slots_[idx(static_cast<int64_t>(rank) * slots_per_rank_ + v)];
    if (s == expert) s = kEmpty;
  }
}

void VExpertMap::validate() const {
  std::vector<int> count(idx(experts_), 0);
  for (int r = 0; r < ranks_; ++r) {
    std::vector<bool> seen(idx(experts_), false);
    for (int v = 0; v < slots_per_rank_; ++v) {
      const int32_t e = slot(r, v);
      MOE_CHECK(e >= kEmpty && e < experts_, "vExpert map: slot ", v, " of rank ", r, " holds ", e,
                ", not an expert in [0, ", experts_, ") or empty (-1)");
      if (e == kEmpty) continue;
      MOE_CHECK(!seen[idx(e)], "vExpert map: rank ", r, " holds expert ", e,
                " twice (replicas of one expert on one rank are not allowed)");
      seen[idx(e)] = true;
      ++count[idx(e)];
    }
  }
  for (int64_t e = 0; e < experts_; ++e)
    MOE_CHECK(count[idx(e)] >= 1, "vExpert map: expert ", e,
              " has no replica on any rank; every expert needs at least one");
}

ExpertAssignment VExpertMap::assignment() const {
  ExpertAssignment a;
  a.replicas.resize(idx(experts_));
  for (int64_t e = 0; e < experts_; ++e) a.replicas[idx(e)] = holders(e);
  return a;
}

// ---- FlexRoute
// ------------------------------------------------------------------------------------

int64_t FlexRoute::at(int src, int64_t expert, int dst) const {
  return counts[idx((static_cast<int64_t>(src) * experts + expert) * ranks + dst)];
}

std::vector<int64_t> FlexRoute::send_counts(int src) const {
  std::vector<int64_t> out(idx(ranks), 0);
  for (int64_t e = 0; e < experts; ++e)
    for (int d = 0; d < ranks; ++d) out[idx(d)] += at(src, e, d);
  return out;
}

std::vector<int64_t> FlexRoute::rank_tokens() const {
  std::vector<int64_t> out(idx(ranks), 0);
  for (int s = 0; s < ranks; ++s)
    for (int64_t e = 0; e < experts; ++e)
      for (int d = 0; d < ranks; ++d) out[idx(d)] += at(s, e, d);
  return out;
}

namespace {

// Integer rounding of x[s][h] = row[s] * col[h] / total (rows and columns are integers summing to
// `total`) with both margins exact. The rule is documented at flexible_route in the header.
std::vector<std::vector<int64_t>> round_proportional(const std::vector<int64_t>& row,
                                                     const std::vector<int64_t>& col) {
  const size_t S = row.size(), H = col.size();
  const int64_t total = std::accumulate(row.begin(), row.end(), int64_t{0});
  std::vector<std::vector<int64_t>> out(S, std::vector<int64_t>(H, 0));
  if (total == 0) return out;
  // Remainders as exact integers: row*col = q*total + rem, 0 <= rem < total, compared exactly.
  // Products fit int64 for any token count below 3e9 per expert per step.
  std::vector<std::vector<int64_t>> rem(S, std::vector<int64_t>(H, 0));
  std::vector<int64_t> row_need(row), col_need(col);
  struct Cell {
    int64_t rem;
    size_t s, h;
  };
  std::vector<Cell> cells;
  for (size_t s = 0; s < S; ++s)
    for (size_t h = 0; h < H; ++h) {
      const int64_t p = row[s] * col[h];
      out[s][h] = p / total;
      rem[s][h] = p % total;
      row_need[s] -= out[s][h];
      col_need[h] -= out[s][h];
      if (rem[s][h] > 0) cells.push_back({rem[s][h], s, h});
    }
  std::stable_sort(cells.begin(), cells.end(),
                   [](const Cell& a, const Cell& b) { return a.rem > b.rem; });
  std::vector<std::vector<bool>> extra(S, std::vector<bool>(H, false));
  for (const Cell& c : cells)
    if (row_need[c.s] > 0 && col_need[c.h] > 0) {
      extra[c.s][c.h] = true;
      --row_need[c.s];
      --col_need[c.h];
    }
  // Augmenting paths: from a row still missing units, through a cell with a remainder and no extra
  // unit, to a column; a column still missing units ends the path, a complete one continues to a
  // row whose extra unit in that column can move elsewhere. Breadth-first in index order.
  for (size_t s0 = 0; s0 < S; ++s0)
    while (row_need[s0] > 0) {
      std::vector<int64_t> row_from(S, -1), col_from(H, -1);  // BFS parents
      std::vector<bool> row_seen(S, false), col_seen(H, false);
      std::vector<size_t> queue{s0};
      row_seen[s0] = true;
      int64_t end = -1;
      for (size_t qi = 0; qi < queue.size() && end < 0; ++qi) {
        const size_t s = queue[qi];
        for (size_t h = 0; h < H && end < 0; ++h) {
          if (col_seen[h] || rem[s][h] == 0 || extra[s][h]) continue;
          col_seen[h] = true;
          col_from[h] = static_cast<int64_t>(s);
          if (col_need[h] > 0) {
            end = static_cast<int64_t>(h);
            break;
          }
          for (size_t s2 = 0; s2 < S; ++s2)
            if (!row_seen[s2] && extra[s2][h]) {
              row_seen[s2] = true;
              row_from[s2] = static_cast<int64_t>(h);
              queue.push_back(s2);
            }
        }
      }
      MOE_CHECK(end >= 0, "flexible routing: no integer rounding found (internal error)");
      --col_need[idx(end)];
      --row_need[s0];
      for (size_t h = idx(end);;) {  // flip the path back to s0
        const size_t s = idx(col_from[h]);
        extra[s][h] = true;
        if (s == s0) break;
        const size_t h_prev = idx(row_from[s]);
        extra[s][h_prev] = false;
        h = h_prev;
      }
    }
  for (size_t s = 0; s < S; ++s)
    for (size_t h = 0; h < H; ++h) out[s][h] += extra[s][h] ? 1 : 0;
  return out;
}

}  // namespace

FlexRoute flexible_route(const VExpertMap& map, const TokenMatrix& tokens) {
  map.validate();
  const int R = map.ranks();
  const int64_t E = map.experts();
  check_tokens(tokens, R, E);
  FlexRoute route;
  route.ranks = R;
  route.experts = E;
  route.counts.assign(idx(static_cast<int64_t>(R) * E * R), 0);
  auto cell = [&](int s, int64_t e, int d) -> int64_t& {
    return route.counts[idx((static_cast<int64_t>(s) * E + e) * R + d)];
  };
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int32_t> holders = map.holders(e);
    const auto n = static_cast<int64_t>(holders.size());
    int64_t total = 0;
    for (int s = 0; s < R; ++s) total += tokens[idx(s)][idx(e)];
    if (total == 0) continue;
    // 1. quotas: the leftover units go to the holders with the most local tokens (ties: rank).
    std::vector<int64_t> quota(idx(n), total / n);
    std::vector<size_t> by_local(idx(n));
    std::iota(by_local.begin(), by_local.end(), size_t{0});
    std::stable_sort(by_local.begin(), by_local.end(), [&](size_t a, size_t b) {
      return tokens[idx(holders[a])][idx(e)] > tokens[idx(holders[b])][idx(e)];
    });
    for (int64_t j = 0; j < total % n; ++j) ++quota[by_local[idx(j)]];
    // 2. keep locally; 3. overflow per source, spare per holder.
    std::vector<int64_t> overflow(idx(R)), spare(idx(n));
    for (int s = 0; s < R; ++s) overflow[idx(s)] = tokens[idx(s)][idx(e)];
    for (int64_t j = 0; j < n; ++j) {
      const int h = holders[idx(j)];
      const int64_t kept = std::min(tokens[idx(h)][idx(e)], quota[idx(j)]);
      cell(h, e, h) = kept;
      overflow[idx(h)] -= kept;
      spare[idx(j)] = quota[idx(j)] - kept;
    }
    // 4. proportional split with an exact integer rounding.
    const auto x = round_proportional(overflow, spare);
    for (int s = 0; s < R; ++s)
      for (int64_t j = 0; j < n; ++j) cell(s, e, holders[idx(j)]) += x[idx(s)][idx(j)];
  }
  return route;
}

// ---- cost model -------------------------------------------------------------------------------

double CostModel::link(int from, int to) const {
  const auto R = static_cast<int64_t>(gemm_tokens_per_s.size());
  MOE_CHECK(from >= 0 && from < R && to >= 0 && to < R && bandwidth.size() == idx(R * R),
            "cost model: no bandwidth from rank ", from, " to rank ", to, " (", R, " ranks, ",
            bandwidth.size(), " bandwidth entries)");
  return bandwidth[idx(from * R + to)];
}

void CostModel::validate(int ranks) const {
  const auto R = static_cast<size_t>(ranks);
  MOE_USAGE_CHECK(gemm_tokens_per_s.size() == R, "cost model: gemm_tokens_per_s has ",
                  gemm_tokens_per_s.size(), " rates for ", ranks, " ranks");
  for (size_t r = 0; r < R; ++r)
    MOE_USAGE_CHECK(gemm_tokens_per_s[r] > 0, "cost model: rank ", r, "'s GEMM rate ",
                    gemm_tokens_per_s[r], " tokens/s is not positive");
  MOE_USAGE_CHECK(bandwidth.size() == R * R, "cost model: bandwidth has ", bandwidth.size(),
                  " entries, not ", ranks, "x", ranks);
  for (size_t a = 0; a < R; ++a)
    for (size_t b = 0; b < R; ++b)
      MOE_USAGE_CHECK(a == b || bandwidth[a * R + b] > 0, "cost model: bandwidth from rank ", a,
                      " to rank ", b, " is ", bandwidth[a * R + b], " bytes/s, not positive");
  MOE_USAGE_CHECK(allreduce_bytes_per_s.size() == R + 1, "cost model: allreduce_bytes_per_s has ",
                  allreduce_bytes_per_s.size(), " entries, not ", R + 1,
                  " (one per group size 0..R)");
  for (size_t g = 2; g <= R; ++g)
    MOE_USAGE_CHECK(allreduce_bytes_per_s[g] > 0, "cost model: allreduce rate of a group of ", g,
                    " is ", allreduce_bytes_per_s[g], " bytes/s, not positive");
  MOE_USAGE_CHECK(bytes_per_token > 0 && grad_bytes_per_expert >= 0 && state_bytes_per_expert >= 0,
                  "cost model: bytes_per_token (", bytes_per_token, ") must be > 0, gradient (",
                  grad_bytes_per_expert, ") and state bytes (", state_bytes_per_expert, ") >= 0");
}

StepEstimate estimate_step(const VExpertMap& map, const FlexRoute& route, const CostModel& cost) {
  const int R = map.ranks();
  MOE_CHECK(route.ranks == R && route.experts == map.experts(), "estimate_step: the route is for ",
            route.ranks, " ranks x ", route.experts, " experts, the map for ", R, " x ",
            map.experts());
  cost.validate(R);
  StepEstimate est;
  est.compute_s.assign(idx(R), 0);
  est.a2a_s.assign(idx(R), 0);
  est.sync_s.assign(idx(R), 0);
  est.total_s.assign(idx(R), 0);
  const std::vector<int64_t> processed = route.rank_tokens();
  for (int r = 0; r < R; ++r) {
    est.compute_s[idx(r)] = double(processed[idx(r)]) / cost.gemm_tokens_per_s[idx(r)];
    for (int p = 0; p < R; ++p) {
      if (p == r) continue;
      int64_t in = 0;
      for (int64_t e = 0; e < map.experts(); ++e) in += route.at(p, e, r);
      est.a2a_s[idx(r)] += 4.0 * double(in) * cost.bytes_per_token / cost.link(p, r);
    }
  }
  for (int64_t e = 0; e < map.experts(); ++e) {
    const std::vector<int32_t> holders = map.holders(e);
    if (holders.size() < 2) continue;
    const double t = cost.grad_bytes_per_expert / cost.allreduce_bytes_per_s[holders.size()];
    for (int32_t r : holders) est.sync_s[idx(r)] += t;
  }
  for (int r = 0; r < R; ++r) {
    est.total_s[idx(r)] = est.compute_s[idx(r)] + est.a2a_s[idx(r)] + est.sync_s[idx(r)];
    if (est.total_s[idx(r)] > est.step_s) {
      est.step_s = est.total_s[idx(r)];
      est.straggler = r;
    }
  }
  return est;
}

double adjustment_s(const CostModel& cost, int from, int to) {
  if (from == to) return 0;
  return cost.state_bytes_per_expert / cost.link(from, to);
}

// ---- policy maker -----------------------------------------------------------------------------

double balance_ratio(const FlexRoute& route) { return max_over_mean(route.rank_tokens()); }

namespace {

// One candidate move of the policy maker: the map after it and the actions that lead there.
struct Move {
  VExpertMap map;
  std::vector<PlanAction> actions;
};

// FlexMoE's Expand(e0) (+ Shrink(e1) when no slot is free), as documented at make_plan; none when
// no target rank exists.
std::optional<Move> expand_move(const VExpertMap& map, const FlexRoute& route,
                                const std::vector<int64_t>& expert_tokens, const CostModel& cost) {
  const int R = map.ranks();
  const int64_t E = map.experts();
  const std::vector<int64_t> load = route.rank_tokens();
  // Tokens per replica compared exactly: a/n_a vs b/n_b as a*n_b vs b*n_a.
  auto per_replica_less = [&](int64_t a, int64_t b) {
    return expert_tokens[idx(a)] * map.replicas(b) < expert_tokens[idx(b)] * map.replicas(a);
  };
  int64_t e0 = 0;
  for (int64_t e = 1; e < E; ++e)
    if (per_replica_less(e0, e)) e0 = e;
  // The least-loaded rank (ties: lower rank) among those `ok` accepts.
  auto least_loaded = [&](auto ok) {
    int best = -1;
    for (int r = 0; r < R; ++r)
      if (ok(r) && (best < 0 || load[idx(r)] < load[idx(best)])) best = r;
    return best;
  };
  int target = least_loaded([&](int r) { return !map.holds(r, e0) && map.free_slots(r) > 0; });
  int64_t e1 = -1;
  if (target < 0) {
    for (int64_t e = 0; e < E; ++e) {
      if (e == e0 || map.replicas(e) < 2) continue;
      bool movable = false;
      for (int r = 0; r < R; ++r) movable = movable || (map.holds(r, e) && !map.holds(r, e0));
      if (movable && (e1 < 0 || per_replica_less(e, e1))) e1 = e;
    }
    if (e1 < 0) return std::nullopt;  // no slot can be freed for e0
    target = least_loaded([&](int r) { return map.holds(r, e1) && !map.holds(r, e0); });
  }
  if (target < 0) return std::nullopt;  // e0 is on every rank
  int from = -1;
  for (int32_t h : map.holders(e0))
    if (from < 0 || cost.link(h, target) > cost.link(from, target)) from = h;
  Move move{map, {}};
  if (e1 >= 0) {
    move.map.remove_replica(target, e1);
    move.actions.push_back({PlanAction::Kind::shrink, e1, target, -1, 0.0});
  }
  move.map.add_replica(target, e0);
  move.actions.push_back(
      {PlanAction::Kind::expand, e0, target, from, adjustment_s(cost, from, target)});
  return move;
}

}  // namespace

Plan make_plan(const VExpertMap& start, const TokenMatrix& tokens, const CostModel& cost,
               const PolicyOptions& options) {
  start.validate();
  const int R = start.ranks();
  const int64_t E = start.experts();
  check_tokens(tokens, R, E);
  cost.validate(R);
  MOE_USAGE_CHECK(options.threshold >= 1, "policy maker: ", flag_for(Setting::balance_threshold),
                  " must be >= 1 (got ", options.threshold,
                  "; the balance ratio max/mean is never below 1)");
  MOE_USAGE_CHECK(options.max_steps >= 0, "policy maker: max_steps must be >= 0 (got ",
                  options.max_steps, ")");
  const int max_steps = options.max_steps > 0 ? options.max_steps : R * start.slots_per_rank();
  std::vector<int64_t> expert_tokens(idx(E), 0);
  for (int s = 0; s < R; ++s)
    for (int64_t e = 0; e < E; ++e) expert_tokens[idx(e)] += tokens[idx(s)][idx(e)];

  Plan plan{start, {}, {}, {}, 0};
  FlexRoute route = flexible_route(plan.map, tokens);
  double t0 = estimate_step(plan.map, route, cost).step_s;
  plan.step_s.push_back(t0);
  plan.balance.push_back(balance_ratio(route));
  for (int step = 0; step < max_steps; ++step) {
    std::optional<Move> best;
    FlexRoute best_route;
    double best_t = t0;
    if (plan.balance.back() > options.threshold) {
      if (auto move = expand_move(plan.map, route, expert_tokens, cost)) {
        FlexRoute r = flexible_route(move->map, tokens);
        const double t1 = estimate_step(move->map, r, cost).step_s;
        if (t1 < best_t) {
          best = std::move(move);
          best_route = std::move(r);
          best_t = t1;
        }
      }
    }
    if (!best && options.migrate) {
      // Migrate: merge a replica into the other holders of its expert (its tokens are routed to
      // them), the one that cuts the step time most (ties: lower expert, then lower rank).
      for (int64_t e = 0; e < E; ++e) {
        if (plan.map.replicas(e) < 2) continue;
        for (int32_t r : plan.map.holders(e)) {
          VExpertMap next = plan.map;
          next.remove_replica(r, e);
          FlexRoute next_route = flexible_route(next, tokens);
          const double t1 = estimate_step(next, next_route, cost).step_s;
          if (t1 < best_t) {
            best = Move{std::move(next), {{PlanAction::Kind::migrate, e, r, -1, 0.0}}};
            best_route = std::move(next_route);
            best_t = t1;
          }
        }
      }
    }
    if (!best) break;
    for (const PlanAction& a : best->actions) {
      plan.actions.push_back(a);
      plan.adjustment_s += a.cost_s;
    }
    plan.map = std::move(best->map);
    route = std::move(best_route);
    t0 = best_t;
    plan.step_s.push_back(t0);
    plan.balance.push_back(balance_ratio(route));
  }
  return plan;
}

}  // namespace moe::balance
