// moe-plan predict as a user runs it: a tiny model moe-train trained, a trace moe-profile
// recorded from it, a cluster spec written by hand. The report must add up (tiers, the critical
// path, tokens/s), TSV and JSON must agree, LPT must not be slower than static placement on the
// same loads, and bad specs, layouts and files must be refused naming the file and the key.
#include <catch2/catch.hpp>
#include <map>
#include <nlohmann/json.hpp>

#include "support/hf_families.h"
#include "support/plan_cluster.h"
#include "support/run.h"

using namespace moe;
using test::fields;
using test::lines_of;
using test::run_command;
using test::tool;

namespace {

// One node of 4 devices; `device` is each device's memory.
std::string cluster_text(const std::string& device) {
  test::ClusterText c;
  c.device = device;
  return c.toml();
}

struct Planned {
  test::ScratchDir dir{"cli-plan"};
  std::string ckpt, trace, cluster, small;
  Planned() {
    ckpt = test::train_on_fortunes(dir / "run", test::kTinyModel + " --steps 2");
    trace = dir / "trace.h5";
    auto r = run_command(tool("moe-profile", "record -q --model " + ckpt + " --data " +
                                                 test::fortunes_path("computers") +
                                                 " --batch 4 --max-tokens 512 -o " + trace));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    cluster = dir / "node.toml";
    test::write_file(cluster, cluster_text("80GiB"));
    small = dir / "small.toml";
    test::write_file(small, cluster_text("64KiB"));
  }
  std::string predict(const std::string& cluster_path, const std::string& flags) const {
    return tool("moe-plan", "predict --model " + ckpt + " --trace " + trace + " --cluster " +
                                cluster_path + " " + flags);
  }
};

Planned& planned() {
  static Planned p;
  return p;
}

// "section\tname" -> value, from the TSV report.
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

}  // namespace

TEST_CASE("cli: moe-plan predict adds up, in TSV and JSON", "[cli][plan]") {
  Planned& p = planned();
  auto r = run_command(p.predict(p.cluster, "--layout ep=4,zero=1 --batch 2"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto v = values(r.out);
  double device = 0;
  for (const auto& [key, bytes] : v)
    if (key.rfind("memory\tdevice: ", 0) == 0) device += bytes;
  CHECK(v.at("tier\tdevice need") == Approx(device).epsilon(1e-5));
  CHECK(v.at("tier\tdevice capacity") == 80.0 * 1024 * 1024 * 1024);
  CHECK(v.count("tier\tdevice does not fit, short by") == 0);
  const double step = v.at("time\tdense_compute") + v.at("time\texpert_compute") +
                      v.at("time\tall_to_all") + v.at("time\tallreduce_exposed") +
                      v.at("time\tzero_gathers") + v.at("time\toptimizer_exposed");
  CHECK(v.at("time\tstep") == Approx(step).epsilon(1e-5));
  CHECK(v.at("time\texpert_compute") >= v.at("time\texpert_compute_balanced") * (1 - 1e-6));
  CHECK(v.at("time\tall_to_all") > 0);
  // 2 sequences of the model's 16 tokens on each of 4 ranks
  CHECK(v.at("throughput\ttokens_per_s") == Approx(4 * 2 * 16 / v.at("time\tstep")).epsilon(1e-5));

  auto j = run_command(p.predict(p.cluster, "--layout ep=4,zero=1 --batch 2 --json"));
  REQUIRE(j.exit_code == 0);
  const auto json = nlohmann::json::parse(j.out);
  CHECK(json.at("layout") ==
        "ep=4,dp=1,zero=1,offload=none,placement=static,a2a=flat,scheduler=off");
  CHECK(json.at("time").at("step_s").get<double>() == Approx(v.at("time\tstep")).epsilon(1e-5));
  CHECK(json.at("tiers").at("device").at("need_bytes").get<double>() ==
        Approx(v.at("tier\tdevice need")).epsilon(1e-5));

  // offload=ssd: the host cache's hit rate, replayed from the trace, prices the uploads.
  auto ssd = values(run_command(p.predict(p.cluster, "--layout ep=2,offload=ssd --batch 2")).out);
  CHECK(ssd.at("offload\tssd_host_cache_hit_rate") >= 0);
  CHECK(ssd.at("offload\tssd_host_cache_hit_rate") <= 1);
  CHECK(ssd.at("tier\tssd need") > 0);

  // LPT places the same loads no worse than the static split.
  auto lpt = values(run_command(p.predict(p.cluster, "--layout ep=4,placement=lpt --batch 2")).out);
  auto fixed = values(run_command(p.predict(p.cluster, "--layout ep=4 --batch 2")).out);
  CHECK(lpt.at("time\texpert_compute") <= fixed.at("time\texpert_compute") * (1 + 1e-9));
}

TEST_CASE("cli: moe-plan predict says what does not fit, by how much", "[cli][plan]") {
  Planned& p = planned();
  auto r = run_command(p.predict(p.small, "--layout ep=2"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto v = values(r.out);
  CHECK(v.at("tier\tdevice does not fit, short by") ==
        Approx(v.at("tier\tdevice need") - 64 * 1024).epsilon(1e-5));
  CHECK(v.at("throughput\tfits") == 0);
}

TEST_CASE("cli: moe-plan predict refuses bad inputs naming the file and the key", "[cli][plan]") {
  Planned& p = planned();
  std::string text = cluster_text("80GiB");
  test::write_file(p.dir / "no-memcpy.toml",
                   text.replace(text.find("memcpy = \"10GB/s\"\n"), 18, ""));
  auto r = run_command(p.predict(p.dir / "no-memcpy.toml", ""));
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("moe-plan: error: " + p.dir / "no-memcpy.toml" +
                                    ": [bandwidth] missing key 'memcpy'"));

  text = cluster_text("80GiB");
  test::write_file(p.dir / "unitless.toml", text.replace(text.find("\"100GB/s\""), 9, "100"));
  r = run_command(p.predict(p.dir / "unitless.toml", ""));
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("[bandwidth] intra_node: must be a quoted quantity"));

  r = run_command(p.predict(p.cluster, "--layout ep=3"));
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("layout: ep=3 does not divide the cluster's 4 ranks"));

  r = run_command(p.predict(p.cluster, "--layout ep=4,pp=2"));
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("layout: unknown key 'pp'"));

  r = run_command(p.predict(p.dir / "absent.toml", ""));
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("absent.toml"));

  r = run_command(tool(
      "moe-plan", "predict --model " + p.ckpt + " --trace " + p.ckpt + " --cluster " + p.cluster));
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains(p.ckpt));
}

TEST_CASE("cli: moe-plan predict and search read a Hugging Face model", "[cli][plan]") {
  Planned& p = planned();
  // The tiny Mixtral of the import tests (D 32, F 48, 2 layers of 4 experts, like the trace's
  // model; context 64): config.json alone, since nothing reads a tensor.
  const std::string hf = p.dir / "hf-mixtral";
  std::filesystem::create_directories(hf);
  test::write_file(hf + "/config.json",
                   test::hf::mixtral_config(test::hf::tiny_of("mixtral")).dump(2));
  const std::string rest = " --trace " + p.trace + " --cluster " + p.cluster;
  auto r = run_command(
      tool("moe-plan", "predict --model " + hf + rest + " --layout ep=2 --batch 2 --json"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto json = nlohmann::json::parse(r.out);
  CHECK(json.at("tokens_per_rank") == 2 * 64);
  // ep=2: 2 of each layer's 4 experts, SwiGLU's 3 x 32 x 48 parameters, 16 B each (f32).
  double experts = -1;
  for (const auto& item : json.at("memory"))
    if (item.at("what") == "experts' state") experts = item.at("bytes").get<double>();
  CHECK(experts == 2 * 2 * 3 * 32 * 48 * 16);
  auto again = run_command(tool("moe-plan", "predict --model " + hf + "/config.json" + rest +
                                                " --layout ep=2 --batch 2 --json"));
  CHECK(again.out == r.out);
  auto s = run_command(tool("moe-plan", "search --model " + hf + rest + " --top 2"));
  INFO(s.err);
  CHECK(s.exit_code == 0);
  CHECK(lines_of(s.out).size() == 5);  // two comment lines, the header, two layouts

  nlohmann::json llama = test::hf::mixtral_config(test::hf::tiny_of("mixtral"));
  llama["model_type"] = "llama";
  test::write_file(p.dir / "llama.json", llama.dump());
  r = run_command(tool("moe-plan", "predict --model " + p.dir / "llama.json" + rest));
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("moe-plan: error: '" + p.dir / "llama.json" +
                                    "': model_type 'llama' is not supported"));
}
