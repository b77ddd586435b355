// FlexMoE's planning core (balance/flexmoe.h): the vExpert map, flexible routing (Alg. 3) against
// hand-worked matrices and its invariants on random ones, the cost model against hand-computed
// step times, the greedy policy maker against hand-worked cost tables, and bad inputs.
// Shape letters: R ranks, V slots per rank, E experts.
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <random>

#include "moe/balance/flexmoe.h"
#include "moe/comm/communicator.h"
#include "moe/error.h"
#include "moe/train/placement.h"

using namespace moe;
using namespace moe::balance;

namespace {

std::vector<int64_t> route_row(const FlexRoute& route, int src, int64_t e) {
  std::vector<int64_t> out;
  for (int d = 0; d < route.ranks; ++d) out.push_back(route.at(src, e, d));
  return out;
}

// Every rank at `tokens_per_s`, every link at `bw`, every group's allreduce at `ar`.
CostModel uniform_cost(int R, double tokens_per_s, double bw, double ar) {
  CostModel c;
  c.gemm_tokens_per_s.assign(static_cast<size_t>(R), tokens_per_s);
  c.bandwidth.assign(static_cast<size_t>(R * R), bw);
  c.allreduce_bytes_per_s.assign(static_cast<size_t>(R + 1), ar);
  c.bytes_per_token = 1;
  c.grad_bytes_per_expert = 10;
  c.state_bytes_per_expert = 500;
  return c;
}

// The invariants of flexible_route on any input: rows sum to I[s][e], only holders receive, every
// holder ends at its quota (I_e / n_e, leftovers to the most local tokens), each overflow cell is
// the floor or ceiling of its proportional share.
void check_route_invariants(const VExpertMap& map, const TokenMatrix& I, const FlexRoute& route) {
  const int R = map.ranks();
  for (int64_t e = 0; e < map.experts(); ++e) {
    const auto holders = map.holders(e);
    const auto n = static_cast<int64_t>(holders.size());
    int64_t total = 0;
    for (int s = 0; s < R; ++s) total += I[static_cast<size_t>(s)][static_cast<size_t>(e)];
    for (int s = 0; s < R; ++s) {
      int64_t row = 0;
      for (int d = 0; d < R; ++d) {
        const int64_t c = route.at(s, e, d);
        REQUIRE(c >= 0);
        if (!map.holds(d, e)) REQUIRE(c == 0);
        row += c;
      }
      REQUIRE(row == I[static_cast<size_t>(s)][static_cast<size_t>(e)]);
    }
    int64_t got_total = 0;
    for (int32_t h : holders) {
      int64_t got = 0;
      for (int s = 0; s < R; ++s) got += route.at(s, e, h);
      REQUIRE((got == total / n || got == total / n + 1));
      got_total += got;
      // A holder keeps what its quota allows of its own tokens before receiving any.
      const int64_t local = I[static_cast<size_t>(h)][static_cast<size_t>(e)];
      REQUIRE(route.at(h, e, h) == std::min(local, got));
    }
    REQUIRE(got_total == total);
    // Exactly total mod n holders get the extra token.
    int64_t extra = 0;
    for (int32_t h : holders) {
      int64_t got = 0;
      for (int s = 0; s < R; ++s) got += route.at(s, e, h);
      extra += got - total / n;
    }
    REQUIRE(extra == total % n);
    // Overflow o_s and spare_h from the route; each cell s -> h (s != h) is the floor or the
    // ceiling of o_s * spare_h / O.
    std::vector<int64_t> overflow(static_cast<size_t>(R)), spare(static_cast<size_t>(R), 0);
    for (int s = 0; s < R; ++s)
      overflow[static_cast<size_t>(s)] =
          I[static_cast<size_t>(s)][static_cast<size_t>(e)] - route.at(s, e, s);
    for (int32_t h : holders)
      for (int s = 0; s < R; ++s)
        if (s != h) spare[static_cast<size_t>(h)] += route.at(s, e, h);
    const int64_t O = std::accumulate(overflow.begin(), overflow.end(), int64_t{0});
    for (int s = 0; s < R; ++s)
      for (int32_t h : holders) {
        if (s == h) continue;
        const int64_t exact = overflow[static_cast<size_t>(s)] * spare[static_cast<size_t>(h)];
        const int64_t scaled = route.at(s, e, h) * O;
        if (O == 0) REQUIRE(route.at(s, e, h) == 0);
        if (O == 0) continue;
        REQUIRE(scaled > exact - O);
        REQUIRE(scaled < exact + O);
      }
  }
}

}  // namespace

TEST_CASE("flexmoe: vExpert map, contiguous start, replicas, validation", "[balance]") {
  VExpertMap m = VExpertMap::contiguous(2, 2, 3);  // ceil(3/2) = 2 per rank: {0,1}, {2,-}
  REQUIRE(m.slots() == std::vector<int32_t>{0, 1, 2, VExpertMap::kEmpty});
  REQUIRE(m.holders(2) == std::vector<int32_t>{1});
  REQUIRE(m.free_slots(0) == 0);
  REQUIRE(m.free_slots(1) == 1);
  m.add_replica(1, 0);
  REQUIRE(m.holders(0) == std::vector<int32_t>{0, 1});
  REQUIRE(m.replicas(0) == 2);
  REQUIRE(m.assignment().replicas == std::vector<std::vector<int32_t>>{{0, 1}, {0}, {1}});
  REQUIRE_THROWS_WITH(m.add_replica(1, 1), Catch::Contains("no free slot"));
  REQUIRE_THROWS_WITH(m.add_replica(0, 0), Catch::Contains("already holds expert 0"));
  REQUIRE_THROWS_WITH(m.remove_replica(0, 1), Catch::Contains("last one"));
  REQUIRE_THROWS_WITH(m.remove_replica(1, 1), Catch::Contains("holds no replica"));
  m.remove_replica(0, 0);
  REQUIRE(m.slots() == std::vector<int32_t>{VExpertMap::kEmpty, 1, 2, 0});
  m.validate();
}

TEST_CASE("flexmoe: bad maps, sizes and tokens fail with a message that names them", "[balance]") {
  REQUIRE_THROWS_WITH(VExpertMap(0, 2, 2), Catch::Contains("ranks must be >= 1"));
  REQUIRE_THROWS_AS(VExpertMap(0, 2, 2), UsageError);
  REQUIRE_THROWS_WITH(VExpertMap(2, 0, 2), Catch::Contains("--vexperts-per-rank must be >= 1"));
  REQUIRE_THROWS_WITH(VExpertMap(2, 1, 3), Catch::Contains("at least 2"));
  REQUIRE_THROWS_WITH(VExpertMap::contiguous(3, 2, 8), Catch::Contains("cannot hold 8 experts"));
  // Expert 1 without a replica; expert 0 twice on rank 0; an expert id out of range.
  REQUIRE_THROWS_WITH(VExpertMap::from_slots(2, 2, 2, {0, -1, 0, -1}),
                      Catch::Contains("expert 1 has no replica"));
  REQUIRE_THROWS_WITH(VExpertMap::from_slots(2, 2, 2, {0, 0, 1, -1}),
                      Catch::Contains("holds expert 0 twice"));
  REQUIRE_THROWS_WITH(VExpertMap::from_slots(2, 2, 2, {0, 5, 1, -1}),
                      Catch::Contains("holds 5, not an expert"));
  REQUIRE_THROWS_WITH(VExpertMap::from_slots(2, 2, 2, {0, 1}), Catch::Contains("2 slots given"));
  // Tokens: negative, wrong shape.
  const VExpertMap m = VExpertMap::contiguous(2, 1, 2);
  REQUIRE_THROWS_WITH(flexible_route(m, {{1, -3}, {2, 2}}),
                      Catch::Contains("rank 0 sends -3 tokens to expert 1"));
  REQUIRE_THROWS_WITH(flexible_route(m, {{1, 3}}), Catch::Contains("1 rows for 2 ranks"));
  REQUIRE_THROWS_WITH(flexible_route(m, {{1, 3, 4}, {1, 1, 1}}),
                      Catch::Contains("3 entries for 2 experts"));
  // Cost model: missing rates, a zero link, a missing allreduce rate.
  CostModel c = uniform_cost(2, 10, 100, 100);
  c.gemm_tokens_per_s.pop_back();
  REQUIRE_THROWS_WITH(c.validate(2), Catch::Contains("1 rates for 2 ranks"));
  c = uniform_cost(2, 10, 100, 100);
  c.bandwidth[1] = 0;
  REQUIRE_THROWS_WITH(c.validate(2), Catch::Contains("from rank 0 to rank 1"));
  c = uniform_cost(2, 10, 100, 100);
  c.bandwidth[0] = 0;  // the diagonal is unused
  c.validate(2);
  c.allreduce_bytes_per_s = {1, 1};
  REQUIRE_THROWS_WITH(c.validate(2), Catch::Contains("one per group size"));
  c = uniform_cost(2, 10, 100, 100);
  REQUIRE_THROWS_WITH(make_plan(m, {{1, 1}, {1, 1}}, c, {0.5, 0}),
                      Catch::Contains("--balance-threshold must be >= 1"));
}

TEST_CASE("flexmoe: routing without replicas sends every token to the one holder", "[balance]") {
  // 2 ranks, expert 0 on rank 0, expert 1 on rank 1.
  const VExpertMap m = VExpertMap::contiguous(2, 1, 2);
  const TokenMatrix I{{3, 5}, {4, 2}};
  const FlexRoute r = flexible_route(m, I);
  REQUIRE(route_row(r, 0, 0) == std::vector<int64_t>{3, 0});
  REQUIRE(route_row(r, 0, 1) == std::vector<int64_t>{0, 5});
  REQUIRE(route_row(r, 1, 0) == std::vector<int64_t>{4, 0});
  REQUIRE(route_row(r, 1, 1) == std::vector<int64_t>{0, 2});
  REQUIRE(r.send_counts(0) == std::vector<int64_t>{3, 5});
  REQUIRE(r.send_counts(1) == std::vector<int64_t>{4, 2});
  REQUIRE(r.rank_tokens() == std::vector<int64_t>{7, 7});
  REQUIRE(balance_ratio(r) == 1.0);
}

TEST_CASE("flexmoe: routing to 2 replicas keeps local tokens up to the quota, 2 ranks",
          "[balance]") {
  // Expert 0 on ranks 0 and 1, expert 1 on rank 0. I_0 = 9 over 2 replicas: quotas 5 (rank 0 has
  // more local tokens, 7 > 2, so it takes the leftover token) and 4. Rank 0 keeps 5 of its 7 and
  // sends 2 to rank 1, which keeps its own 2 and so ends at its quota of 4.
  const VExpertMap m = VExpertMap::from_slots(2, 2, 2, {0, 1, 0, -1});
  const TokenMatrix I{{7, 4}, {2, 3}};
  const FlexRoute r = flexible_route(m, I);
  REQUIRE(route_row(r, 0, 0) == std::vector<int64_t>{5, 2});
  REQUIRE(route_row(r, 1, 0) == std::vector<int64_t>{0, 2});
  REQUIRE(route_row(r, 0, 1) == std::vector<int64_t>{4, 0});
  REQUIRE(route_row(r, 1, 1) == std::vector<int64_t>{3, 0});
  REQUIRE(r.rank_tokens() == std::vector<int64_t>{12, 4});
  REQUIRE(balance_ratio(r) == Approx(12.0 / 8.0));
  // Leftover tie (3 local tokens each, I_0 = 7): the lower rank takes it.
  const FlexRoute t = flexible_route(m, {{3, 0}, {4, 0}});
  REQUIRE(route_row(t, 0, 0) == std::vector<int64_t>{3, 0});
  REQUIRE(route_row(t, 1, 0) == std::vector<int64_t>{0, 4});
  const FlexRoute u = flexible_route(m, {{5, 0}, {2, 0}});  // quotas 4 (rank 0), 3 (rank 1)
  REQUIRE(route_row(u, 0, 0) == std::vector<int64_t>{4, 1});
  REQUIRE(route_row(u, 1, 0) == std::vector<int64_t>{0, 2});
}

TEST_CASE("flexmoe: routing splits overflow over spare capacity in proportion, 3 ranks",
          "[balance]") {
  // Expert 0 on ranks 0 and 1, expert 1 on rank 2. I_0 = 1 + 2 + 8 = 11: quotas 5 (rank 0) and 6
  // (rank 1 has more local tokens). Spare: 5 - 1 = 4 and 6 - 2 = 4; rank 2's 8 split 4/4.
  const VExpertMap m = VExpertMap::from_slots(3, 1, 2, {0, 0, 1});
  const TokenMatrix I{{1, 6}, {2, 0}, {8, 1}};
  const FlexRoute r = flexible_route(m, I);
  REQUIRE(route_row(r, 0, 0) == std::vector<int64_t>{1, 0, 0});
  REQUIRE(route_row(r, 1, 0) == std::vector<int64_t>{0, 2, 0});
  REQUIRE(route_row(r, 2, 0) == std::vector<int64_t>{4, 4, 0});
  REQUIRE(route_row(r, 0, 1) == std::vector<int64_t>{0, 0, 6});
  REQUIRE(route_row(r, 2, 1) == std::vector<int64_t>{0, 0, 1});
  REQUIRE(r.rank_tokens() == std::vector<int64_t>{5, 6, 7});
  // Unequal spare: I_0 = 0 + 3 + 6 = 9, quotas 4 (rank 0) and 5 (rank 1 has more local tokens,
  // 3 > 0); spare 4 and 2, so rank 2's 6 tokens split 4/2.
  const FlexRoute s = flexible_route(m, {{0, 0}, {3, 0}, {6, 0}});
  REQUIRE(route_row(s, 2, 0) == std::vector<int64_t>{4, 2, 0});
  REQUIRE(route_row(s, 1, 0) == std::vector<int64_t>{0, 3, 0});
  check_route_invariants(m, I, r);
}

TEST_CASE("flexmoe: routing rounds the proportional split by largest remainder, 4 ranks",
          "[balance]") {
  // Expert 0 on ranks 0 and 1 (quotas 3 and 3 of I_0 = 6), expert 1 on ranks 2 and 3. Rank 0
  // keeps 1 (spare 2), rank 1 keeps 0 (spare 3); ranks 2 and 3 overflow 3 and 2 of O = 5:
  //   x = [3*2/5, 3*3/5; 2*2/5, 2*3/5] = [1.2, 1.8; 0.8, 1.2] -> floors [1, 1; 0, 1], one unit
  // missing in each row and column; remainders 0.8 (row 2 -> rank 1) and 0.8 (row 3 -> rank 0)
  // are the largest: [1, 2; 1, 1].
  const VExpertMap m = VExpertMap::from_slots(4, 1, 2, {0, 0, 1, 1});
  const TokenMatrix I{{1, 0}, {0, 0}, {3, 2}, {2, 2}};
  const FlexRoute r = flexible_route(m, I);
  REQUIRE(route_row(r, 2, 0) == std::vector<int64_t>{1, 2, 0, 0});
  REQUIRE(route_row(r, 3, 0) == std::vector<int64_t>{1, 1, 0, 0});
  REQUIRE(route_row(r, 0, 0) == std::vector<int64_t>{1, 0, 0, 0});
  REQUIRE(route_row(r, 2, 1) == std::vector<int64_t>{0, 0, 2, 0});
  REQUIRE(route_row(r, 3, 1) == std::vector<int64_t>{0, 0, 0, 2});
  check_route_invariants(m, I, r);
}

TEST_CASE("flexmoe: when the greedy rounding stalls an augmenting path completes it, 6 ranks",
          "[balance]") {
  // Expert 0 on ranks 0..2 (quotas 9, no local tokens: spare 9 each), expert 1 on ranks 3..5.
  // Ranks 3, 4, 5 send 11, 5, 11 tokens of expert 0: x = row / 3 -> floors [3,3,3; 1,1,1; 3,3,3],
  // each row and column misses 2 units, and all nine remainders are equal (2/3). Greedy in index
  // order gives row 3 columns 0 and 1, row 4 columns 0 and 1, row 5 column 2, then stalls (row 5
  // misses one, only column 2 has room, and (5,2) is taken). The path row 5 -> column 0 -> row 3
  // -> column 2 moves row 3's unit from column 0 to 2 and gives row 5 column 0.
  const VExpertMap m = VExpertMap::from_slots(6, 1, 2, {0, 0, 0, 1, 1, 1});
  const TokenMatrix I{{0, 0}, {0, 0}, {0, 0}, {11, 1}, {5, 1}, {11, 1}};
  const FlexRoute r = flexible_route(m, I);
  REQUIRE(route_row(r, 3, 0) == std::vector<int64_t>{3, 4, 4, 0, 0, 0});
  REQUIRE(route_row(r, 4, 0) == std::vector<int64_t>{2, 2, 1, 0, 0, 0});
  REQUIRE(route_row(r, 5, 0) == std::vector<int64_t>{4, 3, 4, 0, 0, 0});
  REQUIRE(r.rank_tokens() == std::vector<int64_t>{9, 9, 9, 1, 1, 1});
  check_route_invariants(m, I, r);
}

TEST_CASE("flexmoe: routing invariants and the same answer under relabelled experts and slots",
          "[balance]") {
  std::mt19937_64 gen(17);
  for (int trial = 0; trial < 300; ++trial) {
    const int R = 2 + static_cast<int>(gen() % 5);  // 2..6
    const int V = 1 + static_cast<int>(gen() % 3);
    const int64_t E = 1 + static_cast<int64_t>(gen() % static_cast<uint64_t>(R * V));
    // Random map: every expert once, then random extra replicas in free slots.
    std::vector<int32_t> slots(static_cast<size_t>(R * V), -1);
    std::vector<size_t> order(slots.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::shuffle(order.begin(), order.end(), gen);
    size_t used = 0;
    for (int64_t e = 0; e < E; ++e) slots[order[used++]] = static_cast<int32_t>(e);
    VExpertMap m = VExpertMap::from_slots(R, V, E, slots);
    for (int k = 0; k < R * V; ++k) {
      const int r = static_cast<int>(gen() % static_cast<uint64_t>(R));
      const auto e = static_cast<int64_t>(gen() % static_cast<uint64_t>(E));
      if (m.free_slots(r) > 0 && !m.holds(r, e)) m.add_replica(r, e);
    }
    TokenMatrix I(static_cast<size_t>(R), std::vector<int64_t>(static_cast<size_t>(E)));
    for (auto& row : I)
      for (auto& c : row) c = static_cast<int64_t>(gen() % 50) * (gen() % 4 == 0 ? 0 : 1);
    const FlexRoute route = flexible_route(m, I);
    check_route_invariants(m, I, route);
    // Relabel experts by a permutation pi and reverse the slot order on every rank: the route of
    // expert e must equal the new route of pi(e).
    std::vector<int32_t> pi(static_cast<size_t>(E));
    std::iota(pi.begin(), pi.end(), 0);
    std::shuffle(pi.begin(), pi.end(), gen);
    std::vector<int32_t> slots2(m.slots().size());
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) {
        const int32_t e = m.slot(r, V - 1 - v);
        slots2[static_cast<size_t>(r * V + v)] = e < 0 ? e : pi[static_cast<size_t>(e)];
      }
    TokenMatrix I2 = I;
    for (int s = 0; s < R; ++s)
      for (int64_t e = 0; e < E; ++e)
        I2[static_cast<size_t>(s)][static_cast<size_t>(pi[static_cast<size_t>(e)])] =
            I[static_cast<size_t>(s)][static_cast<size_t>(e)];
    const FlexRoute route2 = flexible_route(VExpertMap::from_slots(R, V, E, slots2), I2);
    for (int s = 0; s < R; ++s)
      for (int64_t e = 0; e < E; ++e)
        REQUIRE(route_row(route, s, e) == route_row(route2, s, pi[static_cast<size_t>(e)]));
  }
}

TEST_CASE("flexmoe: the cost model against hand-computed step times", "[balance]") {
  // The 2-rank replicated route above: rank 0 processes 12 tokens (3 of them from rank 1),
  // rank 1 processes 4 (2 from rank 0). Rates 10 and 5 tokens/s; links 0->1 100 B/s, 1->0 50 B/s;
  // 2 bytes per token; expert 0 is replicated: 16 gradient bytes at 8 B/s = 2 s on both ranks.
  const VExpertMap m = VExpertMap::from_slots(2, 2, 2, {0, 1, 0, -1});
  const FlexRoute r = flexible_route(m, {{7, 4}, {2, 3}});
  CostModel c;
  c.gemm_tokens_per_s = {10, 5};
  c.bandwidth = {0, 100, 50, 0};
  c.allreduce_bytes_per_s = {0, 0, 8};
  c.bytes_per_token = 2;
  c.grad_bytes_per_expert = 16;
  c.state_bytes_per_expert = 400;
  const StepEstimate est = estimate_step(m, r, c);
  // rank 0: 12/10 = 1.2 compute; 4 x 3 tokens x 2 B / 50 B/s = 0.48 a2a; 2 sync.
  // rank 1: 4/5 = 0.8 compute; 4 x 2 tokens x 2 B / 100 B/s = 0.16 a2a; 2 sync.
  REQUIRE(est.compute_s[0] == Approx(1.2).epsilon(1e-12));
  REQUIRE(est.compute_s[1] == Approx(0.8).epsilon(1e-12));
  REQUIRE(est.a2a_s[0] == Approx(0.48).epsilon(1e-12));
  REQUIRE(est.a2a_s[1] == Approx(0.16).epsilon(1e-12));
  REQUIRE(est.sync_s == std::vector<double>{2.0, 2.0});
  REQUIRE(est.total_s[0] == Approx(3.68).epsilon(1e-12));
  REQUIRE(est.total_s[1] == Approx(2.96).epsilon(1e-12));
  REQUIRE(est.step_s == est.total_s[0]);
  REQUIRE(est.straggler == 0);
  // Copying an expert's 400 state bytes: 4 s from 0 to 1, 8 s from 1 to 0, free in place.
  REQUIRE(adjustment_s(c, 0, 1) == Approx(4.0).epsilon(1e-12));
  REQUIRE(adjustment_s(c, 1, 0) == Approx(8.0).epsilon(1e-12));
  REQUIRE(adjustment_s(c, 1, 1) == 0.0);
  REQUIRE_THROWS_WITH(adjustment_s(c, 0, 2), Catch::Contains("no bandwidth from rank 0 to rank 2"));
  // Without the replica there is no sync, and rank 0 takes all 9 tokens of expert 0.
  const VExpertMap single = VExpertMap::from_slots(2, 2, 2, {0, 1, -1, -1});
  const StepEstimate est1 = estimate_step(single, flexible_route(single, {{7, 4}, {2, 3}}), c);
  REQUIRE(est1.sync_s == std::vector<double>{0.0, 0.0});
  REQUIRE(est1.compute_s[0] == Approx(1.6).epsilon(1e-12));  // 16 tokens / 10
  REQUIRE(est1.a2a_s[0] == Approx(4 * 5 * 2 / 50.0).epsilon(1e-12));
  REQUIRE(est1.total_s[1] == 0.0);
  REQUIRE_THROWS_WITH(estimate_step(VExpertMap::contiguous(2, 2, 3), r, c),
                      Catch::Contains("the route is for 2 ranks x 2 experts"));
}

TEST_CASE("flexmoe: the policy maker expands the hot expert into a free slot", "[balance]") {
  // 2 ranks x 2 slots, experts {0, 1} on rank 0 and {2} on rank 1, one free slot on rank 1.
  // I_0 = 60, I_1 = 10, I_2 = 10; 10 tokens/s everywhere, 1000 B/s links, 1 byte per token,
  // 10 gradient bytes at 100 B/s = 0.1 s per replicated expert, 500 state bytes = 0.5 s a copy.
  // Before: rank 0 processes 70 tokens (35 from rank 1): 7 + 4*35/1000 = 7.14 s; balance 70/40.
  // Expand(0 -> rank 1): each rank keeps its 30 tokens of expert 0; rank 0: 40 tokens, 5 from
  // rank 1, one replicated expert: 4 + 0.02 + 0.1 = 4.12 s; rank 1: 4 + 0 + 0.1 = 4.1 s.
  const VExpertMap m = VExpertMap::contiguous(2, 2, 3);
  const TokenMatrix I{{30, 5, 0}, {30, 5, 10}};
  const CostModel c = uniform_cost(2, 10, 1000, 100);
  const Plan p = make_plan(m, I, c, {1.1, 0});
  REQUIRE(p.actions.size() == 1);
  REQUIRE(p.actions[0].kind == PlanAction::Kind::expand);
  REQUIRE(p.actions[0].expert == 0);
  REQUIRE(p.actions[0].rank == 1);
  REQUIRE(p.actions[0].from == 0);
  REQUIRE(p.actions[0].cost_s == Approx(0.5).epsilon(1e-12));
  REQUIRE(p.adjustment_s == Approx(0.5).epsilon(1e-12));
  REQUIRE(p.step_s.size() == 2);
  REQUIRE(p.step_s[0] == Approx(7.14).epsilon(1e-12));
  REQUIRE(p.step_s[1] == Approx(4.12).epsilon(1e-12));
  REQUIRE(p.balance == std::vector<double>{70.0 / 40.0, 1.0});
  REQUIRE(p.map.slots() == std::vector<int32_t>{0, 1, 2, 0});
  // Above the ratio already (1.75 < 2): nothing to do.
  const Plan idle = make_plan(m, I, c, {2.0, 0});
  REQUIRE(idle.actions.empty());
  REQUIRE(idle.map == m);
  REQUIRE(idle.step_s.size() == 1);
  // A slow allreduce (10 bytes at 1 B/s = 10 s) makes the replica cost more than it saves:
  // t1 = 4.02 + 10 >= 7.14, so the policy stops with the map unchanged.
  const Plan slow = make_plan(m, I, uniform_cost(2, 10, 1000, 1), {1.1, 0});
  REQUIRE(slow.actions.empty());
  REQUIRE(slow.map == m);
  REQUIRE(slow.step_s == std::vector<double>{idle.step_s[0]});
}

TEST_CASE("flexmoe: the policy maker shrinks the coldest replicated expert when slots are full",
          "[balance]") {
  // Slots {0, 1} on rank 0 and {2, 1} on rank 1: expert 1 has 2 replicas of 5 tokens each.
  // Before: rank 0 processes 60 + 5 tokens (30 from rank 1): 6.5 + 0.12 + 0.1 (expert 1's sync)
  // = 6.72 s. No free slot: e1 = expert 1 (5 tokens per replica), shrunk on rank 1, whose slot
  // takes expert 0: rank 0: 30 + 10 tokens (5 from rank 1) = 4 + 0.02 + 0.1; rank 1: 30 + 10.
  const VExpertMap m = VExpertMap::from_slots(2, 2, 3, {0, 1, 2, 1});
  const TokenMatrix I{{30, 5, 0}, {30, 5, 10}};
  const Plan p = make_plan(m, I, uniform_cost(2, 10, 1000, 100), {1.1, 0});
  REQUIRE(p.actions.size() == 2);
  REQUIRE(p.actions[0].kind == PlanAction::Kind::shrink);
  REQUIRE(p.actions[0].expert == 1);
  REQUIRE(p.actions[0].rank == 1);
  REQUIRE(p.actions[0].cost_s == 0.0);
  REQUIRE(p.actions[1].kind == PlanAction::Kind::expand);
  REQUIRE(p.actions[1].expert == 0);
  REQUIRE(p.actions[1].rank == 1);
  REQUIRE(p.actions[1].from == 0);
  REQUIRE(p.step_s[0] == Approx(6.72).epsilon(1e-12));
  REQUIRE(p.step_s[1] == Approx(4.12).epsilon(1e-12));
  REQUIRE(p.map.slots() == std::vector<int32_t>{0, 1, 2, 0});
  // With every expert on one rank and no free slot there is nothing to shrink: no move.
  const VExpertMap full = VExpertMap::contiguous(2, 2, 4);
  const Plan none = make_plan(full, {{50, 1, 1, 1}, {50, 1, 1, 1}}, uniform_cost(2, 10, 1000, 100));
  REQUIRE(none.actions.empty());
  REQUIRE(none.balance[0] > 1.1);
}

TEST_CASE("flexmoe: the policy maker on random layers keeps every expert, V slots, and improves",
          "[balance]") {
  std::mt19937_64 gen(2026);
  int moves = 0;
  for (int trial = 0; trial < 100; ++trial) {
    const int R = 2 + static_cast<int>(gen() % 4);
    const int V = 1 + static_cast<int>(gen() % 3);
    const int64_t E = std::max<int64_t>(R, R * V - static_cast<int64_t>(gen() % 3));
    const VExpertMap m = VExpertMap::contiguous(R, V, std::min<int64_t>(E, R * V));
    TokenMatrix I(static_cast<size_t>(R), std::vector<int64_t>(static_cast<size_t>(m.experts())));
    for (auto& row : I)
      for (size_t e = 0; e < row.size(); ++e)
        row[e] = static_cast<int64_t>(gen() % 20) + (e == 0 ? 200 : 0);  // expert 0 is hot
    CostModel c = uniform_cost(R, 1000, 1e6, 1e4);
    for (auto& rate : c.gemm_tokens_per_s) rate = 500 + static_cast<double>(gen() % 1000);
    const Plan p = make_plan(m, I, c, {1.05, 0});
    moves += static_cast<int>(p.step_s.size()) - 1;
    p.map.validate();  // every expert keeps a replica, no expert twice on a rank
    REQUIRE(p.map.slots().size() == static_cast<size_t>(R * V));
    for (size_t i = 1; i < p.step_s.size(); ++i) REQUIRE(p.step_s[i] < p.step_s[i - 1]);
    // Replaying the actions on the start map gives the plan's map.
    VExpertMap replay = m;
    for (const PlanAction& a : p.actions) {
      if (a.kind != PlanAction::Kind::expand) replay.remove_replica(a.rank, a.expert);
      if (a.kind == PlanAction::Kind::expand) {
        REQUIRE(replay.holds(a.from, a.expert));
        replay.add_replica(a.rank, a.expert);
      }
    }
    REQUIRE(replay == p.map);
    // It stopped for a reason: below the threshold, out of moves, or the next move does not pay.
    const FlexRoute last = flexible_route(p.map, I);
    REQUIRE(balance_ratio(last) == p.balance.back());
    REQUIRE(estimate_step(p.map, last, c).step_s == p.step_s.back());
    // The same inputs give the same plan.
    const Plan again = make_plan(m, I, c, {1.05, 0});
    REQUIRE(again.map == p.map);
    REQUIRE(again.step_s == p.step_s);
  }
  REQUIRE(moves > 0);  // the hot expert was expanded somewhere
}

TEST_CASE("flexmoe: the policy maker migrates a replica whose sync costs more than it saves",
          "[balance]") {
  // Slots {0, 1} on rank 0 and {1, -} on rank 1: expert 1 is replicated, its sync costs 10 s (10
  // gradient bytes at 1 B/s). I_0 = 20 (10 from rank 1), I_1 = 4 (2 from each rank).
  // Before: rank 0 processes 20 + 2 tokens: 2.2 + 4*10/1000 + 10 = 12.24 s; balance 22/12.
  // Expand(0 -> rank 1, the free slot): both experts replicated, 1.2 + 20 s: rejected.
  // Migrate: dropping expert 1 on rank 0 leaves rank 0 at 20 tokens, 10 from rank 1: 2.04 s;
  // dropping it on rank 1 leaves 24 tokens, 12 from rank 1: 2.448 s. The first is applied. Then
  // the expand still costs a 10 s sync, and nothing is replicated: the policy stops.
  const VExpertMap m = VExpertMap::from_slots(2, 2, 2, {0, 1, 1, -1});
  const TokenMatrix I{{10, 2}, {10, 2}};
  const CostModel c = uniform_cost(2, 10, 1000, 1);
  const Plan p = make_plan(m, I, c, {1.1, 0});
  REQUIRE(p.actions.size() == 1);
  REQUIRE(p.actions[0].kind == PlanAction::Kind::migrate);
  REQUIRE(p.actions[0].expert == 1);
  REQUIRE(p.actions[0].rank == 0);
  REQUIRE(p.actions[0].cost_s == 0.0);
  REQUIRE(p.step_s.size() == 2);
  REQUIRE(p.step_s[0] == Approx(12.24).epsilon(1e-12));
  REQUIRE(p.step_s[1] == Approx(2.04).epsilon(1e-12));
  REQUIRE(p.balance[1] == Approx(20.0 / 12.0).epsilon(1e-12));
  REQUIRE(p.map.slots() == std::vector<int32_t>{0, -1, 1, -1});
  // Balanced already and migrate off: nothing to do; migrate on: the replica goes anyway.
  const Plan off = make_plan(m, I, c, {2.0, 0, false});
  REQUIRE(off.actions.empty());
  const Plan on = make_plan(m, I, c, {2.0, 0, true});
  REQUIRE(on.map == p.map);
  // A fast allreduce (1000 B/s: 0.01 s) makes the replica worth keeping: then Expand(0 -> rank 1)
  // balances the layer (12 tokens each: 1.2 + 0.02 sync + a2a 0) and nothing migrates.
  const Plan fast = make_plan(m, I, uniform_cost(2, 10, 1000, 1000), {1.1, 0});
  REQUIRE(fast.actions.size() == 1);
  REQUIRE(fast.actions[0].kind == PlanAction::Kind::expand);
  REQUIRE(fast.actions[0].expert == 0);
  REQUIRE(fast.actions[0].rank == 1);
  REQUIRE(fast.step_s[1] == Approx(1.22).epsilon(1e-12));
}

TEST_CASE("flexmoe: a checkpoint's placement state missing a key is named in words",
          "[balance]") {
  // Before: the loader passed nlohmann's "[json.exception.out_of_range.403] key 'ranks' not
  // found" through.
  std::unique_ptr<comm::Communicator> group = comm::make_local();
  train::PlacementConfig config;
  config.policy = train::PlacementRule::flexmoe;
  train::FlexMoEPlacement placement(config, *group, {{0, 4}});
  const nlohmann::json state = {{"policy", "flexmoe"}, {"layers", nlohmann::json::object()}};
  try {
    placement.load_state(state);
    FAIL("a state without \"ranks\" was taken");
  } catch (const Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what == "\"placement_state\": \"ranks\" is missing");
  }
}
