// moe-plan search (plan/search.h) on a hand-made cluster of 2 nodes x 2 devices whose best layout
// is worked out below: the layouts it enumerates (counted by hand), the ones it drops for memory
// (counted by hand), the winner and why, the order of the ranking, a cluster where nothing fits,
// --ranks, and the explanation of one layout against another.
#include <catch2/catch.hpp>
#include <set>

#include "moe/error.h"
#include "moe/plan/search.h"
#include "support/models.h"
#include "support/plan_cluster.h"

using namespace moe;
using namespace moe::plan;

namespace {

// 2 nodes x 2 devices. Inside a node links are fast; across nodes slow, with 100 us a message,
// so the all-to-all's cost is its cross-node messages. Device memory is 2 MiB.
std::string two_by_two(const std::string& device) {
  test::ClusterText c;
  c.name = "two by two";
  c.nodes = c.devices_per_node = 2;
  c.device = device;
  c.host = "64MiB";
  c.ssd = "1GB";
  c.inter_node = "100MB/s";
  c.host_device = c.memcpy = "1GB/s";
  c.ssd_bandwidth = "100MB/s";
  c.intra_latency = "1us";
  c.inter_latency = "100us";
  c.f32 = "1GFLOP/s";
  c.cpu_adamw = "1Mparam/s";
  return c.toml();
}

// The plan tests' model (gpt, 2 MoE layers of 4 experts, D 16, 2 heads, seq 16, top-2) with wide
// experts: d_ff 1024, so one expert is 2 x 16 x 1024 = 32768 parameters, 512 KiB of fp32 training
// state (16 B a parameter), and the experts outweigh the dense part (~10k parameters, ~170 KB).
// One sequence of 16 tokens per rank; one traced batch of 64 tokens whose 128 assignments fall
// evenly, 32 on each expert, and whose every expert is touched forward and backward.
SearchInputs inputs(const std::string& device) {
  SearchInputs in;
  in.config = test::plan_model_config();
  in.config.d_ff = 1024;
  in.config.resolve();
  in.cluster = parse_cluster(two_by_two(device), "two-by-two.toml");
  in.trace.tokens = {64};
  in.trace.loads = {{{32, 32, 32, 32}, {32, 32, 32, 32}}};
  in.accesses.experts = 8;
  auto& step = in.accesses.steps.emplace_back();
  for (bool backward : {false, true})
    for (int l = 0; l < 2; ++l)
      for (int e = 0; e < 4; ++e) step.push_back({{backward ? 1 - l : l, e}, backward});
  in.tokens_per_rank = 16;
  in.model_name = "wide.json";
  return in;
}

}  // namespace

TEST_CASE("plan search: every legal layout of 4 ranks, counted by hand", "[plan]") {
  const SearchInputs in = inputs("2MiB");
  const std::vector<Layout> layouts = enumerate_layouts(in.config, in.cluster);
  // ep 1, 2, 4 (divide 4 ranks and 4 experts) x zero 0..3 x offload none, host, ssd x scheduler
  // off, priority; placement static, and lpt, flexmoe where ep > 1; a2a hierarchical only where
  // the EP group spans the nodes (ep 4 > 2 devices per node):
  // ep 1: 4 x 3 x 2 = 24; ep 2: 4 x 3 x 3 x 2 = 72; ep 4: 4 x 3 x 3 x 2 x 2 = 144.
  CHECK(layouts.size() == 240);
  std::set<std::string> seen;
  for (const Layout& l : layouts) {
    CHECK(l.ep * l.dp == 4);
    CHECK(seen.insert(layout_text(l)).second);
    CHECK_NOTHROW(check_layout(l, 4, {4, 4}));
    if (l.a2a == comm::A2AAlgorithm::hierarchical) CHECK(l.ep == 4);
  }
  // One rank: no ZeRO, no scheduler, no expert parallelism worth a placement: 3 offload tiers.
  CHECK(enumerate_layouts(in.config, ranks_of(in.cluster, 1)).size() == 3);
  // A cluster without an SSD offers no offload=ssd.
  ClusterSpec no_ssd = in.cluster;
  no_ssd.ssd_bytes = 0;
  CHECK(enumerate_layouts(in.config, no_ssd).size() == 160);
  // One device a node: hierarchical sends what flat sends; not offered.
  ClusterSpec four_nodes = in.cluster;
  four_nodes.nodes = 4;
  four_nodes.devices_per_node = 1;
  for (const Layout& l : enumerate_layouts(in.config, four_nodes))
    CHECK(l.a2a == comm::A2AAlgorithm::flat);
  CHECK(enumerate_layouts(in.config, four_nodes).size() == 24 + 72 + 72);
}

TEST_CASE("plan search: the best layout of a 2 x 2 cluster, worked by hand", "[plan]") {
  const SearchResult r = search(inputs("2MiB"));
  // Memory (2 MiB = 2.10 MB a device): ep=4 static holds one expert a layer, 1 MiB of state, plus
  // ~0.17 MB of dense state and 16 tokens x 35 KB of activations: ~1.8 MB, fits. Every other
  // layout without offload holds two experts a layer or more (ep 2, ep 1, lpt's all, flexmoe's
  // ceil(4/4) + 1 = 2): 2 MiB of experts alone, short. Offloaded layouts keep four fp32 expert
  // slots (512 KiB) on the device and fit. So 80 layouts without offload, 16 of them fit
  // (ep 4 static x zero x a2a x scheduler): 64 dropped, all short of device memory.
  CHECK(r.considered == 240);
  CHECK(r.short_of[0] == 64);
  CHECK(r.short_of[1] == 0);
  CHECK(r.short_of[2] == 0);
  CHECK(r.ranked.size() == 176);
  CHECK(r.summary() ==
        "240 layouts of 4 ranks considered: 176 fit, 64 dropped (64 short of device memory)");
  // Time: the expert compute is the same for every ep=4 layout (32 rows a rank and expert:
  // 6 x 32 x 32768 / 1 GFLOP/s = 6.3 ms a layer). What differs:
  // - offload: CPU AdamW of the held experts, 2 x 32768 / 1 Mparam/s = 66 ms, 8 ms of it hidden
  //   behind backward: the offloaded layouts are ~4x slower;
  // - a2a: each all-to-all crosses the nodes; flat sends 2 cross-node messages a rank,
  //   hierarchical 1: 100 us less for each of the 8 all-to-alls (2 layers x 4), 0.8 ms a step;
  // - scheduler: the dense gradients' all-reduce over the 4 ranks (slow link: ~1.3 ms) hides
  //   behind backward's ~8.8 ms with priority, stays on the path with off;
  // - zero 1..3 add all-gathers of the dense values over the slow link (~0.5 ms).
  // The best: ep=4, zero=0, no offload, static, hierarchical, priority.
  REQUIRE(!r.ranked.empty());
  const Prediction& best = r.ranked[0].prediction;
  CHECK(layout_text(best.layout) ==
        "ep=4,dp=1,zero=0,offload=none,placement=static,a2a=hierarchical,scheduler=priority");
  CHECK(best.time.allreduce_exposed_s == 0);
  CHECK(best.time.zero_gather_s == 0);
  // Second: the same with zero=2. Its gathers (~0.5 ms) cost less than flat's 0.8 ms, and zero=1
  // takes as long (the same one gather; the all-reduce it keeps whole is hidden either way) in
  // more device memory (the gradients unsharded): the tie goes to the smaller.
  const Prediction& second = r.ranked[1].prediction;
  CHECK(layout_text(second.layout) ==
        "ep=4,dp=1,zero=2,offload=none,placement=static,a2a=hierarchical,scheduler=priority");
  CHECK_THAT(r.ranked[0].why, Catch::StartsWith("ZeRO gathers 100% lower than #2"));
  CHECK_THAT(r.ranked[0].why, Catch::Contains("with zero=0 instead of zero=2"));
  const Prediction& third = r.ranked[2].prediction;
  CHECK(layout_text(third.layout) ==
        "ep=4,dp=1,zero=1,offload=none,placement=static,a2a=hierarchical,scheduler=priority");
  CHECK(third.time.step_s == Approx(second.time.step_s).epsilon(1e-12));
  CHECK(third.memory.need[0] > second.memory.need[0]);
  CHECK_THAT(r.ranked[1].why, Catch::StartsWith("same predicted step as #3 in less device memory"));
  // The flat twin of the best sends one cross-node message more a rank: 100 us for each of the
  // 8 all-to-alls, less the 2048 B / 4 that hierarchical moves inside the node in addition
  // (at 100 GB/s: 5 ns).
  for (const Ranked& x : r.ranked)
    if (layout_text(x.prediction.layout) ==
        "ep=4,dp=1,zero=0,offload=none,placement=static,a2a=flat,scheduler=priority") {
      const double more = 8 * (100e-6 - 512 / 100e9);
      CHECK(x.prediction.time.a2a_s - best.time.a2a_s == Approx(more).epsilon(1e-6));
      CHECK(x.prediction.time.step_s - best.time.step_s == Approx(more).epsilon(1e-6));
    }
  // Only the top three are explained.
  CHECK(!r.ranked[2].why.empty());
  CHECK(r.ranked[3].why.empty());
}

TEST_CASE("plan search: the ranking's order", "[plan]") {
  const SearchResult r = search(inputs("2MiB"), 1000);
  std::set<std::string> seen;
  for (size_t i = 0; i < r.ranked.size(); ++i) {
    const Prediction& p = r.ranked[i].prediction;
    CHECK(p.memory.fits());
    CHECK(seen.insert(layout_text(p.layout)).second);
    if (i > 0) CHECK(p.time.tokens_per_s <= r.ranked[i - 1].prediction.time.tokens_per_s);
    if (i + 1 < r.ranked.size()) CHECK(!r.ranked[i].why.empty());  // explain 1000: all but last
  }
  CHECK(r.ranked.size() + size_t(r.dropped()) == size_t(r.considered));
  // The scheduler only hides: each layout with priority ranks above its twin with off.
  auto place = [&](const std::string& text) {
    for (size_t i = 0; i < r.ranked.size(); ++i)
      if (layout_text(r.ranked[i].prediction.layout) == text) return i;
    FAIL("not ranked: " << text);
    return size_t(0);
  };
  for (const Ranked& x : r.ranked) {
    Layout off = x.prediction.layout;
    if (off.scheduler != comm::SchedulerMode::priority) continue;
    off.scheduler = comm::SchedulerMode::off;
    CHECK(place(layout_text(x.prediction.layout)) < place(layout_text(off)));
  }
  // Each ranked prediction is what predict_layout says of its layout.
  const SearchInputs in = inputs("2MiB");
  for (size_t i = 0; i < r.ranked.size(); i += 17) {
    const Prediction again = predict_layout(in, r.ranked[i].prediction.layout);
    CHECK(again.time.step_s == r.ranked[i].prediction.time.step_s);
    CHECK(again.memory.need[0] == r.ranked[i].prediction.memory.need[0]);
  }
}

TEST_CASE("plan search: a cluster where nothing fits says so, and what came closest", "[plan]") {
  // 256 KiB a device: even four fp32 expert slots (512 KiB) do not fit. Closest: an offloaded
  // layout with zero=3 (the smallest dense share); every ep and placement then needs the same,
  // and the first in order is ep=1 with offload=host.
  try {
    search(inputs("256KiB"));
    FAIL("search found a layout");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Catch::StartsWith("no layout of wide.json fits cluster 'two by two' (4 ranks"));
    CHECK_THAT(m, Catch::Contains("240 layouts of 4 ranks considered: 0 fit, 240 dropped "
                                  "(240 short of device memory)"));
    CHECK_THAT(m, Catch::Contains("the closest, ep=1,dp=4,zero=3,offload=host,"));
    CHECK_THAT(m, Catch::Contains("of device memory per device against 262 KB (short by"));
  }
}

TEST_CASE("plan search: --ranks takes part of a node or whole nodes", "[plan]") {
  const ClusterSpec c = parse_cluster(two_by_two("2MiB"), "two-by-two.toml");
  const ClusterSpec two = ranks_of(c, 2);
  CHECK(two.nodes == 1);
  CHECK(two.devices_per_node == 2);
  const ClusterSpec one = ranks_of(c, 1);
  CHECK(one.ranks() == 1);
  CHECK(one.host_bytes == c.host_bytes / 2);  // its device's share of the node's host memory
  CHECK(ranks_of(c, 0).ranks() == 4);
  CHECK(ranks_of(c, 4).ranks() == 4);
  CHECK_THROWS_WITH(ranks_of(c, 3),
                    "ranks: 3 is neither part of one node nor whole nodes "
                    "(2 devices per node)");
  CHECK_THROWS_AS(ranks_of(c, 3), UsageError);
  CHECK_THROWS_WITH(ranks_of(c, 8), "ranks: 8 asked, but cluster 'two by two' has 4 devices");
}

TEST_CASE("plan search: why one layout wins over another", "[plan]") {
  Prediction a, b;
  a.layout = check_layout(parse_layout("ep=8,a2a=hierarchical"), 16, {8});
  b.layout = check_layout(parse_layout("ep=8"), 16, {8});
  a.time.expert_s = b.time.expert_s = 10e-3;
  a.time.a2a_s = 0.69e-3;
  b.time.a2a_s = 1e-3;
  a.time.step_s = 10.69e-3;
  b.time.step_s = 11e-3;
  CHECK(explain(a, b, 2) ==
        "all-to-all 31% lower than #2 (690 us against 1 ms) with a2a=hierarchical instead of "
        "a2a=flat; step 3% shorter");
  // The same step: the smaller device need wins the tie.
  b.time = a.time;
  a.memory.need[0] = 1e9;
  b.memory.need[0] = 2e9;
  CHECK(explain(a, b, 5) ==
        "same predicted step as #5 in less device memory (1 GB against 2 GB) with "
        "a2a=hierarchical instead of a2a=flat");
}
