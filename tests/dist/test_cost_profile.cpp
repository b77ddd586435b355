// Start-up profiling for FlexMoE's cost model (balance/cost_profile.h) on a real group, 2 and 4
// ranks: every rank returns rank 0's CostModel bit for bit, every pair's link and every group
// size's all-reduce were measured (positive), the model validates for R ranks and gives a finite
// positive step estimate; a spec that differs between ranks ends every rank with an error (no
// rank left waiting); sub-groups of a split profile on their own.
// Shape letters: R ranks, V vExpert slots per rank, E experts.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "moe/balance/cost_profile.h"
#include "moe/comm/communicator.h"
#include "moe/error.h"

moe::comm::Communicator& dist_world();

using namespace moe;
using namespace moe::balance;

namespace {

CostProfileSpec small_spec() {
  CostProfileSpec spec;
  spec.d_model = 64;
  spec.d_ff = 128;
  spec.gated = true;
  spec.dtype_bytes = 4;
  spec.bandwidth_bytes = 1 << 16;
  return spec;
}

// Every double of the model, in field order: the bytes two ranks' models must share.
std::vector<double> flatten(const CostModel& m) {
  std::vector<double> v = m.gemm_tokens_per_s;
  v.insert(v.end(), m.bandwidth.begin(), m.bandwidth.end());
  v.insert(v.end(), m.allreduce_bytes_per_s.begin(), m.allreduce_bytes_per_s.end());
  v.push_back(m.bytes_per_token);
  v.push_back(m.grad_bytes_per_expert);
  v.push_back(m.state_bytes_per_expert);
  return v;
}

// True on every rank when every rank's model has rank 0's bytes (lengths first: a model of
// another size must not be compared past its end).
bool same_bits_everywhere(comm::Communicator& group, const CostModel& m) {
  const std::vector<double> mine = flatten(m);
  const int R = group.size();
  Tensor length = Tensor::empty({1}, DType::i64);
  length.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  Tensor lengths = Tensor::empty({R}, DType::i64);
  group.all_gather(length, lengths);
  for (int r = 0; r < R; ++r)
    if (lengths.data<int64_t>()[r] != length.data<int64_t>()[0]) return false;
  const auto bytes = static_cast<int64_t>(mine.size() * sizeof(double));
  Tensor send = Tensor::empty({bytes}, DType::u8);
  std::memcpy(send.raw(), mine.data(), static_cast<size_t>(bytes));
  Tensor all = Tensor::empty({bytes * R}, DType::u8);
  group.all_gather(send, all);
  const auto* p = static_cast<const std::byte*>(all.raw());
  for (int r = 1; r < R; ++r)
    if (std::memcmp(p, p + r * bytes, static_cast<size_t>(bytes)) != 0) return false;
  return true;
}

// The checks every profiled group must pass, whatever its size.
void check_profile(comm::Communicator& group, const CostProfile& p) {
  const int R = group.size();
  const auto uR = static_cast<size_t>(R);
  const CostModel& m = p.model;
  REQUIRE_NOTHROW(m.validate(R));
  REQUIRE(same_bits_everywhere(group, m));
  // This rank's own rate is its largest probe's, bit for bit, at its place in rank order.
  REQUIRE(m.gemm_tokens_per_s[static_cast<size_t>(group.rank())] == p.gemm_points.back().second);
  for (double rate : m.gemm_tokens_per_s) REQUIRE((std::isfinite(rate) && rate > 0));
  for (size_t a = 0; a < uR; ++a)
    for (size_t b = 0; b < uR; ++b) {
      CAPTURE(a, b);
      const double bw = m.bandwidth[a * uR + b];
      if (a == b) {
        REQUIRE(bw == 0);
      } else {
        REQUIRE((std::isfinite(bw) && bw > 0));
        REQUIRE(bw == m.bandwidth[b * uR + a]);  // one ping-pong per pair
      }
    }
  REQUIRE(m.allreduce_bytes_per_s[0] == 0);
  REQUIRE(m.allreduce_bytes_per_s[1] == 0);
  for (size_t g = 2; g <= uR; ++g) {
    CAPTURE(g);
    REQUIRE((std::isfinite(m.allreduce_bytes_per_s[g]) && m.allreduce_bytes_per_s[g] > 0));
  }

  // The model drives the planner: plain expert parallelism, 2 experts per rank, uneven tokens.
  const int V = 2;
  const int64_t E = 2 * R;
  const VExpertMap map = VExpertMap::contiguous(R, V, E);
  TokenMatrix tokens(uR, std::vector<int64_t>(static_cast<size_t>(E)));
  for (size_t s = 0; s < uR; ++s)
    for (size_t e = 0; e < static_cast<size_t>(E); ++e)
      tokens[s][e] = static_cast<int64_t>(10 + 7 * s + 13 * e);
  const FlexRoute route = flexible_route(map, tokens);
  const StepEstimate est = estimate_step(map, route, m);
  REQUIRE(std::isfinite(est.step_s));
  REQUIRE(est.step_s > 0);
  for (size_t r = 0; r < uR; ++r) {
    CAPTURE(r);
    REQUIRE(est.compute_s[r] > 0);
    if (R > 1)
      REQUIRE(est.a2a_s[r] > 0);  // every rank receives tokens from the others
    else
      REQUIRE(est.a2a_s[r] == 0);
  }
}

}  // namespace

TEST_CASE("cost profile: every rank holds the same measured model", "[dist]") {
  comm::Communicator& world = dist_world();
  const CostProfile p = profile_costs(&world, small_spec());
  check_profile(world, p);
  if (world.rank() == 0)
    std::printf("%s\nprofiled in %.3f s on rank 0\n", describe(p.model).c_str(), p.seconds);
}

TEST_CASE("cost profile: sub-groups of a split profile on their own", "[dist]") {
  comm::Communicator& world = dist_world();
  // Even and odd ranks: two groups of 2 at 4 ranks (profiling at once), groups of 1 at 2 ranks.
  std::unique_ptr<comm::Communicator> group = world.split(world.rank() % 2, world.rank());
  REQUIRE(group);
  CostProfileSpec spec = small_spec();
  spec.gated = false;
  const CostProfile p = profile_costs(group.get(), spec);
  REQUIRE(p.model.gemm_tokens_per_s.size() == static_cast<size_t>(group->size()));
  check_profile(*group, p);
}

TEST_CASE("cost profile: a spec that differs between ranks ends every rank", "[dist]") {
  comm::Communicator& world = dist_world();
  CostProfileSpec spec = small_spec();
  if (world.rank() == world.size() - 1) spec.repeats = spec.repeats + 2;
  REQUIRE_THROWS_WITH(
      profile_costs(&world, spec),
      Catch::Contains("cost profile spec differs between ranks") && Catch::Contains("'7 device="));
  // Every rank threw at the same point: the world still works.
  world.barrier();
}
