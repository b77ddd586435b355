// moe-plan search and the --svg picture as a user runs them: a tiny model moe-train trained, a
// trace moe-profile recorded from it, a cluster of 2 nodes x 2 devices written here. The ranking
// must hold every layout that fits, fastest first, each as `predict` prices it; a cluster where
// nothing fits is refused saying why; --ranks takes part of the cluster. The picture is rendered
// by librsvg (support/render.h) with nothing painted past its canvas, and its bars are read back:
// each step segment as wide as its term's share of the step, each memory item as its bytes.
#include <catch2/catch.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "support/plan_cluster.h"
#include "support/render.h"
#include "support/run.h"

using namespace moe;
using test::fields;
using test::lines_of;
using test::run_command;
using test::tool;

namespace {

std::string cluster_text(const std::string& device) {
  test::ClusterText c;
  c.name = "two by two";
  c.nodes = c.devices_per_node = 2;
  c.device = device;
  return c.toml();
}

struct Searched {
  test::ScratchDir dir{"cli-plan-search"};
  std::string ckpt, trace, cluster, mid, small;
  Searched() {
    ckpt = test::train_on_fortunes(dir / "run", test::kTinyModel + " --steps 2");
    trace = dir / "trace.h5";
    auto r = run_command(tool("moe-profile", "record -q --model " + ckpt + " --data " +
                                                 test::fortunes_path("computers") +
                                                 " --batch 4 --max-tokens 512 -o " + trace));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    cluster = dir / "two.toml";
    test::write_file(cluster, cluster_text("80GiB"));
    mid = dir / "mid.toml";
    test::write_file(mid, cluster_text("256KiB"));
    small = dir / "small.toml";
    test::write_file(small, cluster_text("64KiB"));
  }
  std::string plan(const std::string& sub, const std::string& cluster_path,
                   const std::string& flags) const {
    return tool("moe-plan", sub + " --model " + ckpt + " --trace " + trace + " --cluster " +
                                cluster_path + " " + flags);
  }
};

Searched& searched() {
  static Searched s;
  return s;
}

struct Row {
  std::string layout;
  double tokens_per_s = 0, step_s = 0;
  std::string why;
};

// The rows of search's TSV (comment lines and the header skipped).
std::vector<Row> rows_of(const std::string& out) {
  std::vector<Row> rows;
  for (const std::string& line : lines_of(out)) {
    if (line.empty() || line[0] == '#' || line.rfind("rank\t", 0) == 0) continue;
    const auto f = fields(line);
    REQUIRE(f.size() == 15);
    CHECK(f[0] == std::to_string(rows.size() + 1));
    rows.push_back({f[1], std::stod(f[2]), std::stod(f[3]), f[14]});
  }
  return rows;
}

// "section\tname" -> value, from predict's TSV.
std::map<std::string, double> values(const std::string& out) {
  std::map<std::string, double> v;
  for (const std::string& line : lines_of(out)) {
    if (line.empty() || line[0] == '#' || line.rfind("section\t", 0) == 0) continue;
    const auto f = fields(line);
    REQUIRE(f.size() == 4);
    v[f[0] + "\t" + f[1]] = std::stod(f[2]);
  }
  return v;
}

struct Bar {
  double x, width;
  std::string fill, title;
};

// Every <rect> with a tooltip: the bars' segments.
std::vector<Bar> bars_of(const std::string& svg) {
  std::vector<Bar> out;
  const std::regex rect(
      "<rect x=\"([^\"]+)\" y=\"[^\"]+\" width=\"([^\"]+)\" height=\"[^\"]+\" fill=\"([^\"]+)\""
      "><title>([^<]*)</title>");
  for (std::sregex_iterator it(svg.begin(), svg.end(), rect), end; it != end; ++it)
    out.push_back({std::stod((*it)[1]), std::stod((*it)[2]), (*it)[3], (*it)[4]});
  return out;
}

}  // namespace

TEST_CASE("cli: moe-plan search ranks the layouts that fit, each as predict prices it",
          "[cli][plan]") {
  Searched& s = searched();
  auto r = run_command(s.plan("search", s.cluster, "--batch 2 --top 0"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::vector<Row> rows = rows_of(r.out);
  // 4 ranks, 4 experts: ep 1, 2, 4; 240 layouts (tests/unit/test_plan_search.cpp counts them),
  // all fit in 80 GiB.
  CHECK_THAT(r.out, Catch::Contains("# 240 layouts of 4 ranks considered: 240 fit, 0 dropped\n"));
  REQUIRE(rows.size() == 240);
  std::set<std::string> layouts;
  for (size_t i = 0; i < rows.size(); ++i) {
    CHECK(layouts.insert(rows[i].layout).second);
    if (i > 0) CHECK(rows[i].tokens_per_s <= rows[i - 1].tokens_per_s);
    CHECK((rows[i].why != "-") == (i < 3));  // the top three explained
  }
  CHECK_THAT(rows[0].why, Catch::Contains("lower than #2"));
  // Search predicts as predict does: the same step for the same layout.
  for (size_t i : {size_t(0), size_t(1), size_t(120), size_t(239)}) {
    auto p = run_command(s.plan("predict", s.cluster, "--batch 2 --layout " + rows[i].layout));
    REQUIRE(p.exit_code == 0);
    CHECK(values(p.out).at("time\tstep") == Approx(rows[i].step_s).epsilon(1e-5));
  }
  // --top N prints N rows; JSON says the same as TSV.
  auto top = run_command(s.plan("search", s.cluster, "--batch 2 --top 3"));
  CHECK(rows_of(top.out).size() == 3);
  auto j = run_command(s.plan("search", s.cluster, "--batch 2 --top 3 --format json"));
  REQUIRE(j.exit_code == 0);
  const auto json = nlohmann::json::parse(j.out);
  CHECK(json.at("considered") == 240);
  CHECK(json.at("fit") == 240);
  REQUIRE(json.at("layouts").size() == 3);
  CHECK(json.at("layouts")[0].at("layout") == rows[0].layout);
  CHECK(json.at("layouts")[0].at("why") == rows[0].why);
  CHECK(json.at("layouts")[0].at("time").at("step_s").get<double>() ==
        Approx(rows[0].step_s).epsilon(1e-5));
}

TEST_CASE("cli: moe-plan search drops what does not fit, and says when nothing does",
          "[cli][plan]") {
  Searched& s = searched();
  auto none = run_command(s.plan("search", s.small, "--batch 2"));
  CHECK(none.exit_code == 1);
  CHECK(none.out.empty());
  CHECK_THAT(none.err, Catch::Contains("moe-plan: error: no layout of " + s.ckpt +
                                       " fits cluster 'two by two' (4 ranks"));
  CHECK_THAT(none.err, Catch::Contains("240 short of device memory"));
  CHECK_THAT(none.err, Catch::Contains("; the closest, ep="));

  // 256 KiB: some fit (the layouts need 150 to 340 KB), and the summary counts the rest by the tier
  // they are short of.
  auto some = run_command(s.plan("search", s.mid, "--batch 2 --top 0 --format json"));
  INFO(some.err);
  REQUIRE(some.exit_code == 0);
  const auto json = nlohmann::json::parse(some.out);
  const int64_t fit = json.at("fit"), device = json.at("dropped").at("device");
  CHECK(fit > 0);
  CHECK(device > 0);
  CHECK(fit + device + json.at("dropped").at("host").get<int64_t>() +
            json.at("dropped").at("ssd").get<int64_t>() ==
        240);
  CHECK(json.at("layouts").size() == size_t(fit));
  for (const auto& l : json.at("layouts")) CHECK(l.at("fits") == true);
}

TEST_CASE("cli: moe-plan search --ranks takes part of the cluster", "[cli][plan]") {
  Searched& s = searched();
  auto r = run_command(s.plan("search", s.cluster, "--batch 2 --ranks 2 --top 0"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("(2 ranks: 1 node x 2)"));
  for (const Row& row : rows_of(r.out))
    CHECK(std::regex_search(row.layout, std::regex("^(ep=1,dp=2|ep=2,dp=1),")));
  auto bad = run_command(s.plan("search", s.cluster, "--ranks 3"));
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("ranks: 3 is neither part of one node nor whole nodes"));
  bad = run_command(s.plan("search", s.cluster, "--format csv"));
  CHECK(bad.exit_code == 2);
}

TEST_CASE("cli: moe-plan predict --svg draws the step's terms and the memory against capacity",
          "[cli][plan]") {
  Searched& s = searched();
  const std::string out = s.dir / "plan.svg";
  auto r = run_command(s.plan("predict", s.mid, "--layout ep=4,zero=1 --batch 2 --svg " + out));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto v = values(r.out);
  const std::string svg = test::read_file(out);
  CHECK(test::drawn_outside_canvas(svg, s.dir.path()) == "");
  // The step bar: one segment per non-zero term, 560 px in all, each its share of the step.
  const std::map<std::string, std::string> term = {
      {"dense compute", "dense_compute"}, {"expert compute", "expert_compute"},
      {"all-to-all", "all_to_all"},       {"exposed all-reduce", "allreduce_exposed"},
      {"ZeRO gathers", "zero_gathers"},   {"exposed optimizer", "optimizer_exposed"}};
  const double step = v.at("time\tstep");
  double step_width = 0, device_width = 0;
  std::set<std::string> fills;
  for (const Bar& b : bars_of(svg)) {
    const std::string name = b.title.substr(0, b.title.find(": "));
    if (term.count(name)) {
      // widths are written with 2 decimals: 0.005 px each
      CHECK(b.width == Approx(560 * v.at("time\t" + term.at(name)) / step).margin(0.006));
      step_width += b.width;
      CHECK(fills.insert(b.fill).second);
    } else if (name == "device") {
      const std::string item = b.title.substr(0, b.title.rfind(": "));
      const double scale = std::max(v.at("tier\tdevice need"), v.at("tier\tdevice capacity"));
      CHECK(b.width == Approx(560 * v.at("memory\t" + item) / scale).margin(0.006));
      device_width += b.width;
    }
  }
  CHECK(fills.size() >= 3);  // dense, experts, all-to-all at least
  CHECK(device_width == Approx(560 * v.at("tier\tdevice need") / v.at("tier\tdevice capacity"))
                            .margin(0.03));  // 0.005 px an item
  CHECK(v.count("tier\tdevice does not fit, short by") == 0);
  CHECK(svg.find("short by") == std::string::npos);

  // An existing picture is replaced only with --force; the name must end in .svg.
  auto again = run_command(s.plan("predict", s.small, "--layout ep=4 --svg " + out));
  CHECK(again.exit_code == 1);
  CHECK_THAT(again.err, Catch::Contains("already exists"));
  CHECK(test::read_file(out) == svg);
  again =
      run_command(s.plan("predict", s.small, "--layout ep=4 --batch 2 --svg " + out + " --force"));
  REQUIRE(again.exit_code == 0);
  const std::string small_svg = test::read_file(out);
  CHECK(test::drawn_outside_canvas(small_svg, s.dir.path()) == "");
  CHECK(small_svg.find("short by") != std::string::npos);  // 64 KiB: the device does not fit
  CHECK(small_svg.find("does not fit") != std::string::npos);
  auto bad = run_command(s.plan("predict", s.small, "--svg " + s.dir / "plan.png"));
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("name the file *.svg"));

  // search --svg: the top layout's picture.
  auto top =
      run_command(s.plan("search", s.cluster, "--batch 2 --top 1 --svg " + s.dir / "top.svg"));
  REQUIRE(top.exit_code == 0);
  const std::string top_svg = test::read_file(s.dir / "top.svg");
  CHECK(test::drawn_outside_canvas(top_svg, s.dir.path()) == "");
  CHECK(top_svg.find(rows_of(top.out).at(0).layout + " on 4 ranks") != std::string::npos);
}
