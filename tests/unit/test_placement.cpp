// Lina's placement, the pure parts: packing popularity onto ranks (replicas in proportion,
// first-fit-decreasing) and the rows each rank computes under an assignment.
#include <catch2/catch.hpp>
#include <numeric>
#include <set>

#include "moe/infer/placement.h"

using namespace moe;

namespace {

// Every expert has >= 1 replica, on distinct ranks in [0, R).
void check_valid(const nn::ExpertAssignment& a, int ranks) {
  for (const auto& reps : a.replicas) {
    REQUIRE(!reps.empty());
    std::set<int32_t> distinct(reps.begin(), reps.end());
    CHECK(distinct.size() == reps.size());
    for (int32_t p : reps) CHECK((p >= 0 && p < ranks));
  }
}

}  // namespace

TEST_CASE("placement: uniform popularity packs E/R experts on each rank", "[placement]") {
  for (int R : {1, 2, 4}) {
    nn::ExpertAssignment a = balance::pack_experts(std::vector<double>(8, 1.0), R);
    check_valid(a, R);
    std::vector<int> held(static_cast<size_t>(R), 0);
    for (const auto& reps : a.replicas) {
      CHECK(reps.size() == 1);
      ++held[static_cast<size_t>(reps[0])];
    }
    for (int h : held) CHECK(h == 8 / R);
  }
}

TEST_CASE("placement: a popular expert gets replicas in proportion, the rest first-fit-decreasing",
          "[placement]") {
  // Expert 0 has half the load: n_0 = round(4 * 0.5) = 2 replicas of 0.25 each; experts 1..4
  // (0.125 each) pair up on the other two ranks. Every rank carries 1/4.
  nn::ExpertAssignment a = balance::pack_experts({4, 1, 1, 1, 1}, 4);
  check_valid(a, 4);
  CHECK(a.replicas[0].size() == 2);
  std::vector<std::vector<int64_t>> counts{{400, 100, 100, 100, 100}};  // one source rank
  const std::vector<int64_t> rows = a.rank_rows(counts);
  REQUIRE(rows.size() == 4);
  for (int64_t r : rows) CHECK(r == 200);
  CHECK(infer::max_over_mean(rows) == Approx(1.0));
  // The static layout of the same load on 4 ranks is not possible (5 experts); on 5 ranks it is 400
  // / 160.
  CHECK(infer::max_over_mean(nn::ExpertAssignment::contiguous(5, 5).rank_rows(counts)) ==
        Approx(2.5));
  // An expert with all the load gets every rank, the others one each.
  nn::ExpertAssignment b = balance::pack_experts({1, 0, 0, 0}, 4);
  check_valid(b, 4);
  CHECK(b.replicas[0].size() == 4);
  // All zero: treated as uniform.
  check_valid(balance::pack_experts({0, 0, 0, 0}, 2), 2);
  CHECK_THROWS_WITH(balance::pack_experts({1, -1}, 2), Catch::Contains("not >= 0"));
}

TEST_CASE("placement: rank rows follow the chunking rule of every source", "[placement]") {
  // Expert 0 on ranks {2, 0}; expert 1 on rank 1. Source s sends chunk j of its rows of e to
  // replicas[e][(j + s) % n]: 5 rows -> chunks [0,2) and [2,5).
  nn::ExpertAssignment a;
  a.replicas = {{2, 0}, {1}};
  std::vector<std::vector<int64_t>> counts{{5, 3}, {5, 0}, {1, 4}};
  // s=0: chunk0 (2) -> 2, chunk1 (3) -> 0; s=1: chunk0 (2) -> 0, chunk1 (3) -> 2;
  // s=2: chunk0 (0) -> 2, chunk1 (1) -> 0. Expert 1: 3 + 0 + 4 on rank 1.
  const std::vector<int64_t> rows = a.rank_rows(counts);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0] == 3 + 2 + 1);
  CHECK(rows[1] == 7);
  CHECK(rows[2] == 2 + 3 + 0);
  CHECK(std::accumulate(rows.begin(), rows.end(), int64_t(0)) == 5 + 3 + 5 + 1 + 4);
  CHECK(infer::max_over_mean({3, 3, 3}) == Approx(1.0));
  CHECK(infer::max_over_mean({6, 0, 0}) == Approx(3.0));
}

TEST_CASE("placement: a path table of another model is refused", "[placement]") {
  ModelConfig c;
  c.layers = 2;
  c.experts = 8;
  c.moe_every = 1;
  c.top_k = 2;
  c.resolve();
  profile::PathTable table;
  table.top_k = 2;
  table.experts = {4, 4};
  table.marginal = {std::vector<int64_t>(4, 1), std::vector<int64_t>(4, 1)};
  table.next.resize(1);
  auto world = comm::make_local();
  CHECK_THROWS_WITH(infer::LinaPlacement(table, c, *world),
                    Catch::Contains("built for 2 MoE layers of [4,4] experts") &&
                        Catch::Contains("the model has 2 MoE layers of [8,8] experts"));
  table.experts = {8, 8};
  table.top_k = 1;
  CHECK_THROWS_WITH(infer::LinaPlacement(table, c, *world), Catch::Contains("top-1"));
}
