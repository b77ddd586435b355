// moe-plan's inputs (plan/cluster.h, plan/layout.h): a full cluster spec read back in base units,
// each kind of quantity with its units, and the bad specs and layouts a user writes, each refused
// naming the file, the key and why.
#include <catch2/catch.hpp>
#include <string>

#include "moe/error.h"
#include "moe/plan/cluster.h"
#include "moe/plan/layout.h"
#include "support/run.h"

using namespace moe;
using namespace moe::plan;
using moe::test::error_of;

namespace {

const std::string kSpec = R"(name = "two nodes"
device_kind = "cuda"
nodes = 2
devices_per_node = 4

[memory]
device = "80GiB"
host = "1TiB"
ssd = "0B"

[bandwidth]
intra_node = "450GB/s"
inter_node = "400Gbit/s"
host_device = "64 GB/s"
ssd = "7GB/s"
memcpy = "20GB/s"
device_memory = "3.35TB/s"

[latency]
intra_node = "2us"
inter_node = "5us"

[compute]
f32 = "67TFLOP/s"
bf16 = "989TFLOP/s"
cpu_adamw = "1.5Gparam/s"
)";

// kSpec with the first occurrence of `from` replaced by `to`.
std::string edited(const std::string& from, const std::string& to) {
  std::string s = kSpec;
  const size_t at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

std::string spec_error(const std::string& text) {
  return error_of([&] { parse_cluster(text, "c.toml"); });
}

}  // namespace

TEST_CASE("plan: a cluster spec reads back in base units", "[plan]") {
  const ClusterSpec c = parse_cluster(kSpec, "specs/c.toml");
  CHECK(c.name == "two nodes");
  CHECK_FALSE(c.device_is_host);
  CHECK(c.ranks() == 8);
  CHECK(c.device_bytes == 80.0 * 1024 * 1024 * 1024);
  CHECK(c.host_bytes == 1024.0 * 1024 * 1024 * 1024);
  CHECK(c.ssd_bytes == 0);
  CHECK(c.intra_node_bw == 450e9);
  CHECK(c.inter_node_bw == 50e9);  // 400 Gbit/s = 50 GB/s
  CHECK(c.host_device_bw == 64e9);
  CHECK(c.device_memory_bw == Approx(3.35e12));
  CHECK(c.intra_node_latency == Approx(2e-6));
  CHECK(c.gemm_rate(DType::bf16) == 989e12);
  CHECK(c.gemm_rate(DType::f32) == 67e12);
  CHECK(c.cpu_adamw == 1.5e9);
  // f16 is not given: a model in f16 is refused naming the key.
  CHECK_THAT(error_of([&] { c.gemm_rate(DType::f16); }),
             Catch::Contains("[compute] f16 is not given"));
}

TEST_CASE("plan: [overhead] is optional, and whole when given", "[plan]") {
  // A spec written before [overhead] existed still reads: no non-GEMM cost, and it says so.
  const ClusterSpec old = parse_cluster(kSpec, "specs/c.toml");
  CHECK_FALSE(old.has_overhead);
  CHECK(old.overhead_per_step == 0);
  CHECK(old.overhead_per_layer == 0);
  CHECK(old.elementwise_bw == 0);

  const std::string table =
      "\n[overhead]\nper_step = \"0.25ms\"\nper_layer = \"40us\"\n"
      "elementwise = \"2.5GB/s\"\n";
  const ClusterSpec c = parse_cluster(kSpec + table, "c.toml");
  CHECK(c.has_overhead);
  CHECK(c.overhead_per_step == Approx(2.5e-4));
  CHECK(c.overhead_per_layer == Approx(4e-5));
  CHECK(c.elementwise_bw == 2.5e9);

  auto table_edited = [&](const std::string& from, const std::string& to) {
    std::string t = table;
    return kSpec + t.replace(t.find(from), from.size(), to);
  };
  CHECK_THAT(spec_error(table_edited("per_layer = \"40us\"\n", "")),
             Catch::Contains("c.toml: [overhead] missing key 'per_layer'"));
  CHECK_THAT(spec_error(table_edited("\"2.5GB/s\"", "2.5")),
             Catch::Contains("c.toml:31: [overhead] elementwise: must be a quoted quantity"));
  CHECK_THAT(spec_error(table_edited("\"0.25ms\"", "\"0.25\"")),
             Catch::Contains("[overhead] per_step: '0.25' has no unit"));
  CHECK_THAT(spec_error(table_edited("\"40us\"", "\"-40us\"")),
             Catch::Contains("[overhead] per_layer: '-40us' is negative"));
  CHECK_THAT(spec_error(table_edited("per_step", "per_op")),
             Catch::Contains("[overhead] unknown key 'per_op'"));
}

TEST_CASE("plan: quantities need their unit", "[plan]") {
  CHECK(parse_bytes("1.5KiB", "k") == 1536);
  CHECK(parse_bytes("2 GB", "k") == 2e9);
  CHECK(parse_seconds("250ns", "k") == Approx(250e-9));
  CHECK(parse_flops("1.2PFLOP/s", "k") == Approx(1.2e15));
  CHECK(parse_param_rate("300Mparam/s", "k") == 3e8);
  CHECK_THAT(error_of([] { parse_bytes("80", "[memory] device"); }),
             Catch::Contains("[memory] device: '80' has no unit"));
  CHECK_THAT(error_of([] { parse_bandwidth("80GiB", "[bandwidth] ssd"); }),
             Catch::Contains("unit 'GiB' of '80GiB' is not one of bandwidth"));
  CHECK_THAT(error_of([] { parse_bytes("GiB", "k"); }), Catch::Contains("is not a number"));
}

TEST_CASE("plan: bad cluster specs name the file and the key", "[plan]") {
  struct Case {
    std::string from, to, message;
  };
  const Case cases[] = {
      {"memcpy = \"20GB/s\"\n", "", "c.toml: [bandwidth] missing key 'memcpy'"},
      {"inter_node = \"400Gbit/s\"", "inter_node = \"-400Gbit/s\"",
       "c.toml:13: [bandwidth] inter_node: '-400Gbit/s' is negative"},
      {"host_device = \"64 GB/s\"", "host_device = 64",
       "c.toml:14: [bandwidth] host_device: must be a quoted quantity with its unit"},
      {"ssd = \"7GB/s\"", "ssd = \"7\"", "c.toml:15: [bandwidth] ssd: '7' has no unit"},
      {"ssd = \"7GB/s\"", "ssd = \"0GB/s\"", "c.toml:15: [bandwidth] ssd: must be more than zero"},
      {"nodes = 2", "nodes = 0", "c.toml:3: nodes: must be an integer >= 1"},
      {"devices_per_node = 4\n", "", "c.toml: missing key 'devices_per_node'"},
      {"f32 = ", "fp32 = ", "c.toml:24: [compute] unknown key 'fp32'"},
      {"device_kind = \"cuda\"", "device_kind = \"tpu\"", "device_kind: must be \"cuda\" or"},
      {"[latency]", "[latency", "c.toml:19:"},
  };
  for (const Case& c : cases) {
    INFO(c.to);
    CHECK_THAT(spec_error(edited(c.from, c.to)), Catch::Contains(c.message));
  }
}

TEST_CASE("plan: a layout string parses into typed values", "[plan]") {
  const Layout l = parse_layout(
      "ep=8,zero=3,offload=host,placement=flexmoe,a2a=hierarchical,scheduler=priority");
  CHECK(l.ep == 8);
  CHECK(l.zero == 3);
  CHECK(l.offload == OffloadTier::host);
  CHECK(l.placement == Placement::flexmoe);
  CHECK(l.a2a == comm::A2AAlgorithm::hierarchical);
  CHECK(l.scheduler == comm::SchedulerMode::priority);
  const Layout d = parse_layout("");
  CHECK(d.ep == 1);
  CHECK(d.offload == OffloadTier::none);
  CHECK(layout_text(check_layout(parse_layout("ep=2"), 8, {4, 4})) ==
        "ep=2,dp=4,zero=0,offload=none,placement=static,a2a=flat,scheduler=off");
}

TEST_CASE("plan: bad layouts name the key, and what does not divide", "[plan]") {
  CHECK_THAT(error_of([] { parse_layout("ep=8,tp=2"); }), Catch::Contains("unknown key 'tp'"));
  CHECK_THAT(error_of([] { parse_layout("zero=4"); }),
             Catch::Contains("zero=4: must be an integer from 0 to 3"));
  CHECK_THAT(error_of([] { parse_layout("ep=2,ep=4"); }),
             Catch::Contains("key 'ep' is given twice"));
  CHECK_THAT(error_of([] { parse_layout("offload=nvme"); }),
             Catch::Contains("offload=nvme: must be one of none, host, ssd"));
  CHECK_THAT(error_of([] { parse_layout("ep"); }), Catch::Contains("'ep' is not key=value"));
  CHECK_THAT(error_of([] { check_layout(parse_layout("ep=3"), 8, {6}); }),
             Catch::Contains("ep=3 does not divide the cluster's 8 ranks"));
  CHECK_THAT(error_of([] {
               check_layout(parse_layout("ep=8"), 8, {8, 4});
             }),
             Catch::Contains("ep=8 does not divide the 4 experts of MoE layer 1"));
  CHECK_THAT(error_of([] { check_layout(parse_layout("ep=2,dp=2"), 8, {4}); }),
             Catch::Contains("ep=2 x dp=2 is 4 ranks, but the cluster has 8"));
  CHECK_THAT(error_of([] { check_layout(parse_layout("placement=lpt"), 8, {4}); }),
             Catch::Contains("placement=lpt needs ep > 1"));
}
