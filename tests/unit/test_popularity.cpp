// Popularity summaries and Lina's path estimator on synthetic traces whose answers are known.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "moe/profile/paths.h"
#include "moe/profile/summary.h"
#include "moe/rng.h"
#include "support/run.h"

using namespace moe;

namespace {

// 3 MoE layers of 8 experts, top-2. A token's first choice at layer 0 is t % 8 (balanced), or 0
// for three tokens in four (skewed: t % 4 != 3); at every next layer it is the previous first
// choice + 1; the second choice is always first + 4 (mod 8). The path of first choices therefore
// determines the next layer exactly, while the marginal's top-4 never holds both choices of a
// balanced token (its ties fall to experts 0..3, and e, e+4 are never both below 4).
constexpr int64_t L = 3, K = 2, E = 8;

io::TraceInfo info() {
  io::TraceInfo i;
  i.model_config = {{"arch", "gpt"}};
  i.top_k = K;
  i.moe_blocks = {1, 3, 5};
  i.experts = {E, E, E};
  i.source = "record";
  return i;
}

io::TraceBatch batch(int64_t first, int64_t n, bool skewed) {
  io::TraceBatch b;
  b.loads.assign(L * E, 0);
  b.dropped.assign(L, 0);
  for (int64_t t = first; t < first + n; ++t) {
    b.token_ids.push_back(static_cast<int32_t>(t % 256));
    int32_t e = skewed && t % 4 != 3 ? 0 : static_cast<int32_t>(t % 8);
    for (int64_t l = 0; l < L; ++l) {
      const int32_t second = (e + 4) % 8;
      b.experts.push_back(e);
      b.experts.push_back(second);
      b.gates.push_back(0.7f);
      b.gates.push_back(0.3f);
      ++b.loads[l * E + e];
      ++b.loads[l * E + second];
      e = (e + 1) % 8;
    }
  }
  return b;
}

std::string write(const test::ScratchDir& dir, const std::string& name, bool skewed) {
  const std::string path = dir / name;
  io::TraceWriter w(path, info(), 16);
  w.append(batch(0, 40, skewed));
  w.append(batch(40, 24, skewed));
  w.close();
  return path;
}

}  // namespace

TEST_CASE("profile: summaries of a balanced and a skewed trace", "[profile]") {
  test::ScratchDir dir("profile-summary");
  io::TraceReader balanced(write(dir, "balanced.h5", false));
  std::vector<profile::LayerSummary> s = profile::summarize(balanced);
  REQUIRE(s.size() == 3);
  for (const auto& l : s) {
    REQUIRE(l.tokens == 64);
    REQUIRE(l.assignments == 128);
    REQUIRE(l.counts == std::vector<int64_t>(8, 16));
    REQUIRE(l.max_over_mean == 1.0);
    REQUIRE(l.max_over_min == 1.0);
    REQUIRE(l.cv == 0.0);
    REQUIRE(l.entropy_bits == Approx(3.0));
    REQUIRE(l.entropy_norm == Approx(1.0));
    REQUIRE(l.dropped_fraction == 0.0);
  }
  REQUIRE(s[1].block == 3);
  io::TraceReader skewed(write(dir, "skewed.h5", true));
  s = profile::summarize(skewed);
  // Layer 0: first choices 0 (48 tokens), 3 and 7 (8 each); second choices 4, 7 and 3.
  REQUIRE(s[0].counts == std::vector<int64_t>{48, 0, 0, 16, 48, 0, 0, 16});
  REQUIRE(s[0].max_over_mean == Approx(3.0));
  REQUIRE(std::isinf(s[0].max_over_min));
  REQUIRE(s[0].cv == Approx(std::sqrt(384.0) / 16));
  REQUIRE(s[0].top == std::vector<int64_t>{0, 4, 3, 7, 1, 2, 5, 6});
  const double p = 48.0 / 128, q = 16.0 / 128;
  REQUIRE(s[0].entropy_bits == Approx(-2 * (p * std::log2(p) + q * std::log2(q))));
  REQUIRE(s[0].entropy_norm == Approx(s[0].entropy_bits / 3));
}

TEST_CASE("profile: Lina's path table predicts a path-determined trace exactly", "[profile]") {
  test::ScratchDir dir("profile-paths");
  io::TraceReader balanced(write(dir, "balanced.h5", false));
  io::TraceReader skewed(write(dir, "skewed.h5", true));
  for (int64_t length : {1, 2, 5}) {
    INFO("path length " << length);
    profile::PathTable t = profile::build_paths(balanced, length);
    REQUIRE(t.next.size() == 2);
    REQUIRE(t.next[0].size() == 8);  // every first choice at layer 0
    REQUIRE(t.next[0].at({0}) == std::vector<int64_t>{0, 8, 0, 0, 0, 8, 0, 0});
    REQUIRE(t.marginal[2] == std::vector<int64_t>(8, 16));
    const std::string table = dir / ("paths" + std::to_string(length) + ".json");
    profile::save_paths(t, table);
    profile::PathTable back = profile::load_paths(table);
    REQUIRE(back.next == t.next);
    REQUIRE(back.marginal == t.marginal);
    REQUIRE(back.path_length == length);
    // Every path known and decisive: all hits; the marginal's top-4 never holds e and e+4.
    for (const auto& a : profile::accuracy(back, balanced)) {
      REQUIRE(a.tokens == 64);
      REQUIRE(a.hits == 64);
      REQUIRE(a.unseen_paths == 0);
      REQUIRE(a.marginal_hits == 0);
    }
    // The skewed trace's paths are all among the balanced one's.
    for (const auto& a : profile::accuracy(back, skewed)) REQUIRE(a.hits == 64);
  }
  // Fitted on the skewed trace, a balanced token's path at layer 0 is unseen unless it starts at
  // 0, 3 or 7 (24 of 64 tokens); the other 40 fall back to layer 1's marginal, whose top-4 is
  // {1, 5, 0, 4}: only tokens starting at 4 (choices 5 and 1) hit. 24 + 8 = 32.
  profile::PathTable t = profile::build_paths(skewed, 1);
  std::vector<profile::LayerAccuracy> acc = profile::accuracy(t, balanced);
  REQUIRE(acc[0].layer == 1);
  REQUIRE(acc[0].unseen_paths == 40);
  REQUIRE(acc[0].hits == 32);
  REQUIRE(acc[0].accuracy() == 0.5);
  REQUIRE_THROWS_WITH(profile::build_paths(balanced, 0), Catch::Contains("--path-length"));
}

TEST_CASE("profile: a path table from another model, or not a table, is refused", "[profile]") {
  test::ScratchDir dir("profile-mismatch");
  io::TraceReader fit(write(dir, "fit.h5", false));
  profile::PathTable t = profile::build_paths(fit, 1);
  t.experts = {8, 16, 8};
  REQUIRE_THROWS_WITH(profile::accuracy(t, fit), Catch::Contains("another model"));
  test::write_file(dir / "bad.json", "{\"format\": \"something\"}");
  REQUIRE_THROWS_WITH(profile::load_paths(dir / "bad.json"), Catch::Contains("not a moe.paths"));
  REQUIRE_THROWS_WITH(profile::load_paths(dir / "missing.json"), Catch::Contains("cannot open"));
}

TEST_CASE("profile: a path table is refused when its paths, ids, counts or predicts are wrong",
          "[profile][validation]") {
  test::ScratchDir dir("profile-paths-garbage");
  io::TraceReader fit(write(dir, "fit.h5", false));
  const std::string good = dir / "good.json";
  profile::save_paths(profile::build_paths(fit, 2), good);
  REQUIRE(profile::load_paths(good).next.size() == 2);
  const nlohmann::json table = nlohmann::json::parse(test::read_file(good));
  // layers[1] predicts layer 2 from the first choices at layers 0..1: paths of 2 experts.
  REQUIRE(table["layers"][1]["paths"][0]["path"].size() == 2);
  struct Case {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"short path", [](nlohmann::json& j) { j["layers"][1]["paths"][0]["path"] = {3}; },
       "a path of layers[1] has 1 experts, expected 2"},
      {"long path",
       [](nlohmann::json& j) {
         j["layers"][0]["paths"][0]["path"] = {1, 2};
       },
       "a path of layers[0] has 2 experts, expected 1"},
      {"negative id",
       [](nlohmann::json& j) {
         j["layers"][1]["paths"][0]["path"] = {-1, 2};
       },
       "names expert -1 at layer 0, outside [0, 8)"},
      {"id too large",
       [](nlohmann::json& j) {
         j["layers"][1]["paths"][0]["path"] = {2, 8};
       },
       "names expert 8 at layer 1, outside [0, 8)"},
      {"no predicts", [](nlohmann::json& j) { j["layers"][0].erase("predicts"); },
       "layers[0] has no 'predicts'"},
      {"wrong predicts", [](nlohmann::json& j) { j["layers"][1]["predicts"] = 1; },
       "layers[1].predicts is 1, expected 2"},
      {"negative count", [](nlohmann::json& j) { j["layers"][0]["paths"][0]["counts"][0] = -3; },
       "count of expert 0 is -3"},
      {"negative marginal", [](nlohmann::json& j) { j["marginal"][2][5] = -1; },
       "layer 2's marginal count of expert 5 is -1"},
      {"duplicate path",
       [](nlohmann::json& j) { j["layers"][0]["paths"].push_back(j["layers"][0]["paths"][0]); },
       "twice"},
      {"path_length 0", [](nlohmann::json& j) { j["path_length"] = 0; },
       "path_length 0 is not >= 1"},
      {"fractional top_k", [](nlohmann::json& j) { j["top_k"] = 1.5; }, "not an integer"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    nlohmann::json edited = table;
    c.edit(edited);
    const std::string path = dir / "edited.json";
    test::write_file(path, edited.dump());
    const std::string msg = test::error_of([&] { profile::load_paths(path); });
    INFO(msg);
    REQUIRE_THAT(msg, Catch::StartsWith("path table '" + path + "'") && Catch::Contains(c.message));
  }
}
