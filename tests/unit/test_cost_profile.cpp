// Start-up profiling for FlexMoE's cost model (balance/cost_profile.h) in one process: every field
// the one-rank model uses is filled and valid, the byte sizes follow the header's rules exactly,
// each GEMM probe gives a finite positive rate, describe / to_json carry the numbers, and a bad
// spec is refused naming its field. (The collective part: tests/dist/test_cost_profile.cpp.)
// Shape letters: D model width, F expert hidden width.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>

#include "moe/balance/cost_profile.h"
#include "moe/comm/communicator.h"
#include "moe/error.h"
#include "support/run.h"

using namespace moe;
using namespace moe::balance;

namespace {

CostProfileSpec small_spec(bool gated) {
  CostProfileSpec spec;
  spec.d_model = 64;
  spec.d_ff = 128;
  spec.gated = gated;
  spec.dtype_bytes = 2;
  return spec;
}

// The message of the UsageError profile_costs throws for `spec`, or a note that it threw none.
std::string usage_error(const CostProfileSpec& spec) {
  try {
    profile_costs(nullptr, spec);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

std::string printed(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace

TEST_CASE("cost profile: one process fills a valid one-rank model", "[balance]") {
  for (bool gated : {false, true}) {
    CAPTURE(gated);
    const CostProfileSpec spec = small_spec(gated);
    const CostProfile p = profile_costs(nullptr, spec);
    const CostModel& m = p.model;
    REQUIRE_NOTHROW(m.validate(1));
    REQUIRE(m.gemm_tokens_per_s.size() == 1);
    REQUIRE(std::isfinite(m.gemm_tokens_per_s[0]));
    REQUIRE(m.gemm_tokens_per_s[0] > 0);
    REQUIRE(m.bandwidth == std::vector<double>{0.0});
    REQUIRE(m.allreduce_bytes_per_s == std::vector<double>{0.0, 0.0});
    // The header's rules, exactly: P = F D (3 matrices gated, else 2), gradients fp32, state the
    // fp32 master + Adam m + v.
    const double params = 128.0 * 64.0 * (gated ? 3 : 2);
    REQUIRE(m.bytes_per_token == 64.0 * 2);
    REQUIRE(m.grad_bytes_per_expert == params * 4);
    REQUIRE(m.state_bytes_per_expert == params * 12);
    // One point per probe, in the spec's order, each a finite positive rate; the model's rate is
    // the largest probe's.
    REQUIRE(p.gemm_points.size() == spec.token_counts.size());
    for (size_t i = 0; i < p.gemm_points.size(); ++i) {
      CAPTURE(i);
      REQUIRE(p.gemm_points[i].first == spec.token_counts[i]);
      REQUIRE(std::isfinite(p.gemm_points[i].second));
      REQUIRE(p.gemm_points[i].second > 0);
    }
    REQUIRE(m.gemm_tokens_per_s[0] == p.gemm_points.back().second);
    REQUIRE(p.seconds > 0);
  }
}

TEST_CASE("cost profile: a one-rank communicator is one process", "[balance]") {
  CostProfileSpec spec = small_spec(true);
  spec.token_counts = {300, 40};  // the largest probe need not be the last
  std::unique_ptr<comm::Communicator> local = comm::make_local();
  const CostProfile p = profile_costs(local.get(), spec);
  REQUIRE_NOTHROW(p.model.validate(1));
  REQUIRE(p.gemm_points.size() == 2);
  REQUIRE(p.gemm_points[0].first == 300);
  REQUIRE(p.model.gemm_tokens_per_s == std::vector<double>{p.gemm_points[0].second});
  REQUIRE(p.model.bandwidth == std::vector<double>{0.0});
  REQUIRE(p.model.allreduce_bytes_per_s == std::vector<double>{0.0, 0.0});
}

TEST_CASE("cost profile: describe and to_json carry the numbers", "[balance]") {
  SECTION("a measured one-rank model") {
    const CostProfile p = profile_costs(nullptr, small_spec(false));
    const double rate = p.model.gemm_tokens_per_s[0];
    const std::string text = describe(p.model);
    REQUIRE_THAT(text, Catch::Contains("over 1 rank:"));
    REQUIRE_THAT(text, Catch::Contains(printed(" %.4g", rate)));
    REQUIRE_THAT(text, Catch::Contains("none (one rank)"));
    REQUIRE_THAT(text, Catch::Contains("per token 128, expert gradients 65536, expert state "
                                       "196608"));
    const nlohmann::json j = to_json(p);
    REQUIRE(j["ranks"] == 1);
    REQUIRE(j["gemm_tokens_per_s"][0].get<double>() == rate);
    REQUIRE(j["bandwidth_bytes_per_s"] == nlohmann::json::parse("[[0.0]]"));
    REQUIRE(j["allreduce_bytes_per_s"] == nlohmann::json::parse("[0.0, 0.0]"));
    REQUIRE(j["grad_bytes_per_expert"].get<double>() == 65536);
    REQUIRE(j["state_bytes_per_expert"].get<double>() == 196608);
    REQUIRE(j["gemm_points"].size() == 3);
    REQUIRE(j["gemm_points"][2][0] == 1024);
    REQUIRE(j["gemm_points"][2][1].get<double>() == rate);
    REQUIRE(j["seconds"].get<double>() == p.seconds);
  }
  SECTION("a hand-made two-rank model: the matrix row is the sender") {
    CostModel m;
    m.gemm_tokens_per_s = {1.5e5, 2.5e5};
    m.bandwidth = {0, 2.5e9, 3.0e9, 0};
    m.allreduce_bytes_per_s = {0, 0, 1.25e9};
    m.bytes_per_token = 256;
    m.grad_bytes_per_expert = 98304;
    m.state_bytes_per_expert = 294912;
    const std::string text = describe(m);
    REQUIRE_THAT(text, Catch::Contains("over 2 ranks:"));
    REQUIRE_THAT(text, Catch::Contains("rank: 1.5e+05 2.5e+05"));
    REQUIRE_THAT(text, Catch::Contains("rank 0:        -    2.500"));
    REQUIRE_THAT(text, Catch::Contains("rank 1:    3.000        -"));
    REQUIRE_THAT(text, Catch::Contains("group size: 2: 1.250"));
    REQUIRE_THAT(text, Catch::Contains("per token 256, expert gradients 98304, expert state "
                                       "294912"));
    const nlohmann::json j = to_json(m);
    REQUIRE(j["ranks"] == 2);
    REQUIRE(j["bandwidth_bytes_per_s"] == nlohmann::json::parse("[[0.0, 2.5e9], [3.0e9, 0.0]]"));
    REQUIRE(j["allreduce_bytes_per_s"] == nlohmann::json::parse("[0.0, 0.0, 1.25e9]"));
    REQUIRE(j["bytes_per_token"].get<double>() == 256);
  }
}

TEST_CASE("cost profile: a bad spec is refused naming its field", "[balance]") {
  CostProfileSpec spec = small_spec(false);
  spec.d_model = 0;
  REQUIRE_THAT(usage_error(spec), Catch::Contains("d_model must be positive (got 0)"));
  spec = small_spec(false);
  spec.d_ff = -3;
  REQUIRE_THAT(usage_error(spec), Catch::Contains("d_ff must be positive (got -3)"));
  spec = small_spec(false);
  spec.token_counts.clear();
  REQUIRE_THAT(usage_error(spec), Catch::Contains("token_counts is empty"));
  spec = small_spec(false);
  spec.token_counts = {64, 0};
  REQUIRE_THAT(usage_error(spec), Catch::Contains("token_counts holds 0"));
  spec = small_spec(false);
  spec.dtype_bytes = 0;
  REQUIRE_THAT(usage_error(spec), Catch::Contains("dtype_bytes must be 1..8 (got 0)"));
  spec = small_spec(false);
  spec.bandwidth_bytes = 0;
  REQUIRE_THAT(usage_error(spec), Catch::Contains("bandwidth_bytes must be positive"));
  spec = small_spec(false);
  spec.repeats = 0;
  REQUIRE_THAT(usage_error(spec), Catch::Contains("repeats must be >= 1 (got 0)"));
}

TEST_CASE("cost profile: a cost model value of the wrong type is named by its key",
          "[balance][messages]") {
  // Before: "cost model: must be a number, got null", naming no key (issue 45, item 11).
  CostModel m;
  m.gemm_tokens_per_s = {1.5e5, 2.5e5};
  m.bandwidth = {0, 2.5e9, 3.0e9, 0};
  m.allreduce_bytes_per_s = {0, 0, 1.25e9};
  m.bytes_per_token = 256;
  m.grad_bytes_per_expert = 98304;
  m.state_bytes_per_expert = 294912;
  const nlohmann::json good = to_json(m);
  REQUIRE(cost_model_from_json(good).bandwidth == m.bandwidth);
  const auto error_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    return test::error_of([&] { cost_model_from_json(j); });
  };
  REQUIRE(error_with([](nlohmann::json& j) { j["bytes_per_token"] = nullptr; }) ==
          "cost model: \"bytes_per_token\" must be a number, got null");
  REQUIRE(error_with([](nlohmann::json& j) { j["bandwidth_bytes_per_s"][1][0] = "fast"; }) ==
          "cost model: \"bandwidth_bytes_per_s[1][0]\" must be a number, got a string");
  REQUIRE(error_with([](nlohmann::json& j) { j["gemm_tokens_per_s"] = 3; }) ==
          "cost model: \"gemm_tokens_per_s\" must be an array, got 3");
}
