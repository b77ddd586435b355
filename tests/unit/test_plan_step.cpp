// moe-plan's step-time terms (plan/step_time.h), each on numbers worked by hand, then one step of
// a tiny model whose expert stragglers and all-to-all are worked out in the comments.
#include <algorithm>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "moe/plan/offload_cache.h"
#include "moe/plan/predict.h"
#include "moe/plan/step_time.h"
#include "support/models.h"

using namespace moe;
using namespace moe::plan;

namespace {

// 2 nodes of 4 devices; round numbers so the sums can be read off.
ClusterSpec two_nodes() {
  ClusterSpec c;
  c.nodes = 2;
  c.devices_per_node = 4;
  c.intra_node_bw = 100;
  c.inter_node_bw = 10;
  c.intra_node_latency = 1;
  c.inter_node_latency = 2;
  return c;
}

// gpt, 2 MoE layers of 4 experts, D 16, F 32, 2 heads, seq 16, vocab 256, top-2.
ModelConfig tiny() { return test::plan_model_config(); }

}  // namespace

TEST_CASE("plan: all-to-all flat and hierarchical, hand-worked", "[plan]") {
  const ClusterSpec c = two_nodes();
  // flat over 8: 3 messages at 1 s and 4 at 2 s; 3/8 of 800 B at 100 B/s, 4/8 at 10 B/s
  CHECK(a2a_flat_seconds(800, 8, c) == Approx(3 + 8 + 3 + 40));
  // hierarchical: 3 messages and 3/4 of the bytes inside the node, 1 message and the 4/8 that
  // leave the node across
  CHECK(a2a_hierarchical_seconds(800, 8, c) == Approx(3 + 6 + 2 + 40));
  // inside one node both are the same: 3 messages, 3/4 of the bytes
  CHECK(a2a_flat_seconds(800, 4, c) == Approx(3 + 6));
  CHECK(a2a_hierarchical_seconds(800, 4, c) == Approx(3 + 6));
  CHECK(a2a_flat_seconds(800, 1, c) == 0);
}

TEST_CASE("plan: ring collectives and the links they use, hand-worked", "[plan]") {
  const ClusterSpec c = two_nodes();
  CHECK(link_for(c, 4).bandwidth == 100);
  CHECK(link_for(c, 8).bandwidth == 10);
  const Link l{100, 1};
  CHECK(ring_allgather_seconds(1000, 4, l) == Approx(0.75 * 1000 / 100 + 3));
  CHECK(ring_allreduce_seconds(1000, 4, l) == Approx(2 * (7.5 + 3)));
  CHECK(ring_allreduce_seconds(1000, 1, l) == 0);
  CHECK(exposed_after_overlap(5, 3) == 2);
  CHECK(exposed_after_overlap(2, 3) == 0);
}

TEST_CASE("plan: expert rows per rank by placement, and a rank's expert seconds", "[plan]") {
  const std::vector<double> loads = {4, 3, 2, 1};
  using V = std::vector<std::vector<double>>;
  CHECK(expert_rows_by_rank(loads, 2, Placement::fixed) == V{{4, 3}, {2, 1}});
  // Graham: 4 -> r0, 3 -> r1, 2 -> r1 (3 < 4), 1 -> r0 (4 < 5): 5 and 5
  CHECK(expert_rows_by_rank(loads, 2, Placement::lpt) == V{{4, 1}, {3, 2}});
  CHECK(expert_rows_by_rank(loads, 2, Placement::flexmoe) == V{{2, 1.5, 1, 0.5}, {2, 1.5, 1, 0.5}});
  // 10 rows of a 5-parameter expert at 100 FLOP/s: forward 2*10*5/100 = 1 s, backward 2 s
  CHECK(rank_expert_seconds({10, 0}, 5, 100, 0) == Approx(3));
  // uploads of 1.5 s: max(1.5, 1) + max(1.5, 2)
  CHECK(rank_expert_seconds({10, 0}, 5, 100, 1.5) == Approx(3.5));
}

TEST_CASE("plan: dense FLOPs per token and the trace's active experts", "[plan]") {
  // 6 x (2 layers x (q k v o 1024 + router 64) + head 256 x 16) + 2 layers x 6 x T 16 x 16
  CHECK(dense_flops_per_token(tiny()) == 6 * (2 * 1088 + 4096) + 2 * 6 * 16 * 16);
  TraceLoads t;
  t.tokens = {4, 4};
  t.loads = {{{1, 0, 2, 0}}, {{1, 1, 1, 1}}};
  CHECK(t.active_fraction() == Approx(0.75));
}

TEST_CASE("plan: one step of a tiny model, its stragglers and all-to-all by hand", "[plan]") {
  StepInput in;
  in.config = tiny();
  in.cluster.nodes = 1;
  in.cluster.devices_per_node = 2;
  in.cluster.intra_node_bw = in.cluster.inter_node_bw = 1e9;
  in.cluster.intra_node_latency = in.cluster.inter_node_latency = 1e-6;
  in.cluster.device_memory_bw = 1e12;
  in.cluster.gemm_f32 = 1e6;
  in.layout = check_layout(parse_layout("ep=2"), 2, {4, 4});
  in.tokens_per_rank = 32;
  // one batch of 64 tokens: the EP group's 2 x 32, so the loads are taken as they are
  in.trace.tokens = {64};
  in.trace.loads = {{{10, 20, 30, 4}, {10, 20, 30, 4}}};
  const StepTime t = predict_step(in);
  // static: rank 0 computes 10 + 20 rows, rank 1 30 + 4; 6 FLOPs per row and parameter (1072:
  // W1, W2 and their biases)
  CHECK(t.expert_s == Approx(2 * 6 * 34 * 1072 / 1e6));
  CHECK(t.expert_balanced_s == Approx(2 * 6 * 32 * 1072 / 1e6));
  // 4 all-to-alls per layer of 32 tokens x 2 choices x 16 x 4 B, half to the other rank
  CHECK(t.a2a_s == Approx(2 * 4 * (1e-6 + 4096 / 2 / 1e9)));
  CHECK(t.non_gemm_s == 0);  // the cluster has no [overhead]
  CHECK(t.step_s == Approx(t.dense_s + t.expert_s + t.a2a_s + t.allreduce_exposed_s +
                           t.zero_gather_s + t.optimizer_exposed_s));
  CHECK(t.tokens_per_s == Approx(2 * 32 / t.step_s));
  // Loads LPT can even out: static puts 30 + 20 on rank 0; LPT 30 + 4 and 20 + 10.
  in.trace.loads = {{{30, 20, 10, 4}, {30, 20, 10, 4}}};
  const double fixed = predict_step(in).expert_s;
  in.layout = check_layout(parse_layout("ep=2,placement=lpt"), 2, {4, 4});
  const double lpt = predict_step(in).expert_s;
  CHECK(fixed == Approx(2 * 6 * 50 * 1072 / 1e6));
  CHECK(lpt == Approx(2 * 6 * 34 * 1072 / 1e6));  // {30, 4} and {20, 10}
}

TEST_CASE("plan: the non-GEMM term from [overhead], hand-worked", "[plan]") {
  // Bytes the tiny model's step saves per token (f32, 4 B): per layer the two norm inputs (2 x
  // 16), q, k, v and the attention output (4 x 16), 4 B x 2 heads x T 16 of probabilities, and
  // each of the top-2 rows' expert input (16) and hidden rows (2 x 32, GELU keeps two):
  // 4 x 96 + 128 + 4 x 2 x 80 = 1152; two layers, and the logits' 4 x 256.
  CHECK(activation_bytes_per_token(tiny()) == 2 * 1152 + 1024);
  ClusterSpec c;
  CHECK(non_gemm_seconds(tiny(), 32, c) == 0);  // no [overhead]: nothing counted
  c.has_overhead = true;
  c.overhead_per_step = 1e-3;
  c.overhead_per_layer = 2e-4;
  c.elementwise_bw = 3328e3;  // one token's 3328 B a millisecond
  // 1 ms + 2 layers x 0.2 ms + 32 tokens x 1 ms
  CHECK(non_gemm_seconds(tiny(), 32, c) == Approx(1e-3 + 4e-4 + 32e-3));
  c.elementwise_bw = 0;  // no per-token term
  CHECK(non_gemm_seconds(tiny(), 32, c) == Approx(1.4e-3));

  // In the step: on the critical path, beside the other terms.
  StepInput in;
  in.config = tiny();
  in.cluster = c;
  in.cluster.nodes = in.cluster.devices_per_node = 1;
  in.cluster.device_memory_bw = 1e12;
  in.cluster.gemm_f32 = 1e9;
  in.layout = check_layout(parse_layout("ep=1"), 1, {4, 4});
  in.tokens_per_rank = 32;
  in.trace.tokens = {32};
  in.trace.loads = {{{16, 16, 16, 16}, {16, 16, 16, 16}}};
  const StepTime with = predict_step(in);
  in.cluster.has_overhead = false;
  const StepTime without = predict_step(in);
  CHECK(without.non_gemm_s == 0);
  CHECK(with.non_gemm_s == Approx(1.4e-3));
  CHECK(with.step_s == Approx(without.step_s + 1.4e-3));
  CHECK(with.step_s == Approx(with.dense_s + with.expert_s + with.a2a_s + with.allreduce_exposed_s +
                              with.zero_gather_s + with.optimizer_exposed_s + with.non_gemm_s));
}

TEST_CASE("plan: predict's report says when the spec has no [overhead]", "[plan]") {
  Prediction p;
  p.cluster.name = "old";
  p.time.non_gemm_s = 0;
  const std::vector<std::string> old = prediction_tsv(p);
  REQUIRE(old.size() > 2);
  CHECK(old[1].find("# the cluster spec has no [overhead] table") == 0);
  const nlohmann::json j = prediction_json(p);
  CHECK(j.at("overhead").at("given") == false);
  CHECK(j.at("overhead").contains("note"));
  CHECK(j.at("time").at("non_gemm_s") == 0.0);

  p.cluster.has_overhead = true;
  p.cluster.overhead_per_layer = 2e-4;
  p.time.non_gemm_s = 4e-4;
  const std::vector<std::string> with = prediction_tsv(p);
  for (const std::string& line : with) CHECK(line.find("no [overhead]") == std::string::npos);
  CHECK(std::count(with.begin(), with.end(), "time\tnon_gemm\t0.0004\ts") == 1);
  const nlohmann::json jw = prediction_json(p);
  CHECK(jw.at("overhead").at("given") == true);
  CHECK_FALSE(jw.at("overhead").contains("note"));
  CHECK(jw.at("overhead").at("per_layer_s") == 2e-4);
}

TEST_CASE("plan: offload uploads and the SSD tier's host cache hits, hand-worked", "[plan]") {
  ClusterSpec c;
  c.host_device_bw = 100;
  c.ssd_bw = 10;
  // 25 fp32 parameters: 100 B over the host link, 1 s; a miss first reads the 400 B record
  CHECK(upload_seconds(OffloadTier::none, 25, 400, 0, c) == 0);
  CHECK(upload_seconds(OffloadTier::host, 25, 400, 0, c) == Approx(1));
  CHECK(upload_seconds(OffloadTier::ssd, 25, 400, 0, c) == Approx(1 + 40));
  CHECK(upload_seconds(OffloadTier::ssd, 25, 400, 0.75, c) == Approx(1 + 10));

  // One layer of 4 experts, ep=2: rank 0 holds experts 0 and 1. Steps touch {0, 1, 2}, {0, 3},
  // {1}: rank 0 sees 0 1 | 0 | 1. LRU of one slot: every access misses; of two: 0 and 1 stay.
  offload::AccessSequence seq;
  seq.experts = 4;
  auto key = [](int e) { return offload::Access{{0, e}, false}; };
  seq.steps = {{key(0), key(1), key(2)}, {key(0), key(3)}, {key(1)}};
  const Layout ep2 = check_layout(parse_layout("ep=2"), 2, {4});
  CHECK(host_cache_hit_rate(seq, {4}, ep2, 1) == 0);
  CHECK(host_cache_hit_rate(seq, {4}, ep2, 2) == Approx(0.5));
  // lpt holds every expert: 0 1 2 | 0 3 | 1 through two slots hits none
  const Layout lpt = check_layout(parse_layout("ep=2,placement=lpt"), 2, {4});
  CHECK(host_cache_hit_rate(seq, {4}, lpt, 2) == 0);
}
