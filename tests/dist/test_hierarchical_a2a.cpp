// Hierarchical all-to-all-v against the flat one (the reference), on every rank under mpiexec -n 2
// and -n 4. R = world size, L = ranks per (virtual) node. The count matrix C[src][dst] is a pure
// function of a seed, so every rank knows every count; payloads are random bits. The two results
// start from different fill bytes, so a row either path leaves unwritten shows as a mismatch.
// Assertions come after the collectives so that a failing rank does not leave the others waiting.
#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "moe/comm/all_to_all.h"
#include "moe/comm/communicator.h"
#include "moe/comm/hierarchical_a2a.h"
#include "moe/rng.h"

moe::comm::Communicator& dist_world();  // main.cpp

using namespace moe;
using comm::A2AAlgorithm;
using comm::Communicator;
using comm::HierarchicalAllToAll;
using comm::NodeLayout;

namespace {

using CountMatrix = std::vector<std::vector<int64_t>>;  // [src][dst] rows

// Uneven counts in [0, max_rows], about one in four zero, from `seed`.
CountMatrix random_counts(int R, uint64_t seed, int64_t max_rows) {
  CountMatrix c(R, std::vector<int64_t>(R));
  const uint64_t key = rng_key(seed, {0xa2a});
  for (int s = 0; s < R; ++s)
    for (int d = 0; d < R; ++d) {
      const uint64_t i = static_cast<uint64_t>(s * R + d);
      c[s][d] = rng_below(key, 2 * i, 4) == 0
                    ? 0
                    : 1 + static_cast<int64_t>(rng_below(key, 2 * i + 1, max_rows));
    }
  return c;
}

std::vector<int64_t> row_of(const CountMatrix& c, int s) { return c[s]; }
std::vector<int64_t> column_of(const CountMatrix& c, int d) {
  std::vector<int64_t> out;
  for (const auto& row : c) out.push_back(row[d]);
  return out;
}

// Shape [rows, trailing...] of random bits, distinct per rank and seed.
Tensor random_payload(Shape shape, DType dtype, int rank, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  auto* bytes = static_cast<uint8_t*>(t.raw());
  const uint64_t key = rng_key(seed, {static_cast<uint64_t>(rank), 0xb175});
  for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<uint8_t>(rng_below(key, i, 256));
  return t;
}

Tensor filled(Shape shape, DType dtype, uint8_t byte) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  std::memset(t.raw(), byte, t.nbytes());
  return t;
}

struct Outcome {
  size_t differing_bytes = 0;
  int64_t rows = 0;
};

// One exchange of `c` through the flat and the hierarchical path; counts the bytes that differ.
Outcome compare(Communicator& world, HierarchicalAllToAll& hier, const CountMatrix& c,
                Shape trailing, DType dtype, uint64_t seed) {
  const int me = world.rank();
  std::vector<int64_t> send_counts = row_of(c, me), recv_counts = column_of(c, me);
  const int64_t send_rows = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  const int64_t recv_rows = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  Shape send_shape{send_rows}, recv_shape{recv_rows};
  send_shape.insert(send_shape.end(), trailing.begin(), trailing.end());
  recv_shape.insert(recv_shape.end(), trailing.begin(), trailing.end());
  Tensor send = random_payload(send_shape, dtype, me, seed);
  Tensor flat = filled(recv_shape, dtype, 0xab);
  Tensor two_phase = filled(recv_shape, dtype, 0xcd);
  world.all_to_all_v(send, send_counts, flat, recv_counts);
  hier.all_to_all_v(send, send_counts, two_phase, recv_counts);
  Outcome out;
  out.rows = recv_rows;
  const auto* a = static_cast<const uint8_t*>(flat.raw());
  const auto* b = static_cast<const uint8_t*>(two_phase.raw());
  for (size_t i = 0; i < flat.nbytes(); ++i) out.differing_bytes += a[i] != b[i];
  return out;
}

// The node sizes to try on this world: 1, 2 (when it divides), R, and 0 (the machine's nodes).
std::vector<int> node_sizes(int R) {
  std::vector<int> sizes{0, 1};
  for (int l = 2; l <= R; ++l)
    if (R % l == 0) sizes.push_back(l);
  return sizes;
}

struct Config {
  int ranks_per_node;
  NodeLayout layout;
};

// Every node size, and both layouts where they differ (more than one node of more than one rank:
// cyclic placement is the one that needs the final reorder).
std::vector<Config> configurations(int R) {
  std::vector<Config> out;
  for (int l : node_sizes(R)) {
    out.push_back({l, NodeLayout::block});
    if (l > 1 && l < R) out.push_back({l, NodeLayout::cyclic});
  }
  return out;
}

std::string describe(const Config& c) {
  return std::to_string(c.ranks_per_node) +
         (c.layout == NodeLayout::cyclic ? " ranks per node, cyclic" : " ranks per node, block");
}

}  // namespace

TEST_CASE("hierarchical a2a: node geometry", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  for (int l : node_sizes(R)) {
    if (l == 0) continue;
    HierarchicalAllToAll block(world, l);
    INFO("ranks_per_node " << l);
    CHECK(block.ranks_per_node() == l);
    CHECK(block.nodes() == R / l);
    CHECK(block.node() == me / l);
    CHECK(block.local_rank() == me % l);
    CHECK(block.degenerate() == (l == 1 || l == R));
    if (block.degenerate()) continue;
    HierarchicalAllToAll cyclic(world, l, NodeLayout::cyclic);
    CHECK(cyclic.node() == me % (R / l));
    CHECK(cyclic.local_rank() == me / (R / l));
  }
  // On one machine the real node is the whole world: one node, which degenerates to flat.
  HierarchicalAllToAll machine(world, 0);
  CHECK(machine.ranks_per_node() == R);
  CHECK(machine.nodes() == 1);
  CHECK(machine.degenerate());
}

TEST_CASE("hierarchical a2a equals flat bitwise: random uneven counts, f32, several rounds",
          "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size();
  for (const Config& config : configurations(R)) {
    HierarchicalAllToAll hier(world, config.ranks_per_node, config.layout);
    for (uint64_t round = 0; round < 2; ++round) {
      const uint64_t seed = 1000 + 10 * static_cast<uint64_t>(config.ranks_per_node) + round;
      // Rows of 1 element (a 1-D tensor) and of [3, 5] elements.
      Outcome flat_rows = compare(world, hier, random_counts(R, seed, 9), {}, DType::f32, seed);
      Outcome wide_rows =
          compare(world, hier, random_counts(R, seed + 7, 6), {3, 5}, DType::f32, seed + 7);
      INFO(describe(config) << ", round " << round);
      CHECK(flat_rows.differing_bytes == 0);
      CHECK(wide_rows.differing_bytes == 0);
    }
  }
}

TEST_CASE("hierarchical a2a equals flat bitwise: bf16, i64 and u8 payloads", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size();
  for (const Config& config : configurations(R)) {
    HierarchicalAllToAll hier(world, config.ranks_per_node, config.layout);
    Outcome bf16 = compare(world, hier, random_counts(R, 77, 7), {16}, DType::bf16, 77);
    INFO(describe(config));
    CHECK(bf16.differing_bytes == 0);
    if (hier.degenerate()) continue;  // the flat call itself: one dtype is enough
    Outcome i64 = compare(world, hier, random_counts(R, 78, 7), {2}, DType::i64, 78);
    Outcome u8 = compare(world, hier, random_counts(R, 79, 7), {3}, DType::u8, 79);
    CHECK(i64.differing_bytes == 0);
    CHECK(u8.differing_bytes == 0);
  }
}

TEST_CASE("hierarchical a2a equals flat bitwise: zero counts", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size();
  // Nothing at all; only rank 0 sends (to everyone); only the last rank receives; every rank
  // sends only to itself; a whole (virtual) node of 2 silent.
  std::vector<CountMatrix> patterns;
  patterns.emplace_back(R, std::vector<int64_t>(R, 0));
  CountMatrix only_rank0(R, std::vector<int64_t>(R, 0));
  for (int d = 0; d < R; ++d) only_rank0[0][d] = d + 1;
  patterns.push_back(only_rank0);
  CountMatrix only_last(R, std::vector<int64_t>(R, 0));
  for (int s = 0; s < R; ++s) only_last[s][R - 1] = 2 * s + 1;
  patterns.push_back(only_last);
  CountMatrix self(R, std::vector<int64_t>(R, 0));
  for (int s = 0; s < R; ++s) self[s][s] = 3;
  patterns.push_back(self);
  CountMatrix silent_node = random_counts(R, 5, 4);
  for (int s = 0; s < std::min(R, 2); ++s)
    for (int d = 0; d < R; ++d) silent_node[s][d] = silent_node[d][s] = 0;
  patterns.push_back(silent_node);

  for (const Config& config : configurations(R)) {
    HierarchicalAllToAll hier(world, config.ranks_per_node, config.layout);
    for (size_t p = 0; p < patterns.size(); ++p) {
      Outcome o = compare(world, hier, patterns[p], {4}, DType::f32, 300 + p);
      INFO(describe(config) << ", pattern " << p);
      CHECK(o.differing_bytes == 0);
    }
  }
}

TEST_CASE("hierarchical a2a: workspace reuse across growing and shrinking exchanges", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size();
  HierarchicalAllToAll hier(world, R % 2 == 0 ? 2 : 1);
  size_t differing = 0;
  for (int64_t max_rows : {2, 300, 5, 1200, 1, 40}) {
    Outcome o = compare(world, hier, random_counts(R, 900 + max_rows, max_rows), {8}, DType::f32,
                        900 + static_cast<uint64_t>(max_rows));
    differing += o.differing_bytes;
  }
  CHECK(differing == 0);
}

TEST_CASE("hierarchical a2a: ranks_per_node must divide the world and agree across ranks",
          "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size();
  CHECK_THROWS_WITH(
      HierarchicalAllToAll(world, R + 1),
      Catch::Contains("world size " + std::to_string(R) + " is not divisible by ranks_per_node " +
                      std::to_string(R + 1)));
  CHECK_THROWS_AS(HierarchicalAllToAll(world, 3), moe::Error);  // 3 divides neither 2 nor 4
  CHECK_THROWS_WITH(HierarchicalAllToAll(world, -1), Catch::Contains("negative"));
  // Rank 0 asks for 1, the others for R: every rank throws, none hangs in a split.
  CHECK_THROWS_WITH(HierarchicalAllToAll(world, world.rank() == 0 ? 1 : R),
                    Catch::Contains("every rank must pass the same values"));
  CHECK_THROWS_WITH(comm::AllToAllV(world, A2AAlgorithm::hierarchical, R + 1),
                    Catch::Contains("not divisible"));
}

TEST_CASE("hierarchical a2a: argument checks name the problem", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size();
  HierarchicalAllToAll hier(world, R % 2 == 0 ? 2 : 1);
  std::vector<int64_t> ones(R, 1), short_counts(R - 1, 1);
  Tensor send = Tensor::zeros({R, 2}), recv = Tensor::zeros({R, 2});
  CHECK_THROWS_WITH(hier.all_to_all_v(send, short_counts, recv, ones),
                    Catch::Contains("send counts and"));
  Tensor wrong_rows = Tensor::zeros({R + 1, 2});
  CHECK_THROWS_WITH(hier.all_to_all_v(wrong_rows, ones, recv, ones),
                    Catch::Contains("send counts sum to"));
  Tensor wrong_width = Tensor::zeros({R, 3});
  CHECK_THROWS_WITH(hier.all_to_all_v(send, ones, wrong_width, ones),
                    Catch::Contains("differ in width"));
  Tensor wrong_dtype = Tensor::zeros({R, 2}, DType::bf16);
  CHECK_THROWS_WITH(hier.all_to_all_v(send, ones, wrong_dtype, ones),
                    Catch::Contains("differ in dtype"));
  std::vector<int64_t> negative(R, 1);
  negative[0] = -1;
  negative[R - 1] += 2;
  CHECK_THROWS_WITH(hier.all_to_all_v(send, negative, recv, ones), Catch::Contains("negative"));
  // The object is still usable after refused calls.
  Outcome o = compare(world, hier, random_counts(R, 4242, 5), {2}, DType::f32, 4242);
  CHECK(o.differing_bytes == 0);
}

TEST_CASE("hierarchical a2a: AllToAllV runs the chosen algorithm", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  CHECK(comm::parse_a2a_algorithm("flat") == A2AAlgorithm::flat);
  CHECK(comm::parse_a2a_algorithm("hierarchical") == A2AAlgorithm::hierarchical);
  CHECK_THROWS_WITH(comm::parse_a2a_algorithm("2dh"), Catch::Contains("flat, hierarchical"));
  CHECK(std::string(comm::a2a_algorithm_name(A2AAlgorithm::hierarchical)) == "hierarchical");

  comm::AllToAllV flat(world, A2AAlgorithm::flat);
  comm::AllToAllV hier(world, A2AAlgorithm::hierarchical, R % 2 == 0 ? 2 : 1);
  CHECK(flat.hierarchical() == nullptr);
  REQUIRE(hier.hierarchical() != nullptr);
  CHECK(hier.hierarchical()->ranks_per_node() == (R % 2 == 0 ? 2 : 1));

  CountMatrix c = random_counts(R, 31, 6);
  std::vector<int64_t> send_counts = row_of(c, me), recv_counts = column_of(c, me);
  int64_t rows_in = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  Tensor send = random_payload(
      {std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0}), 3}, DType::f32, me, 31);
  Tensor a = filled({rows_in, 3}, DType::f32, 1), b = filled({rows_in, 3}, DType::f32, 2);
  flat.run(send, send_counts, a, recv_counts);
  hier.run(send, send_counts, b, recv_counts);
  CHECK(std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}
