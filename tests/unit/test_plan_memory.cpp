// moe-plan's memory model (plan/memory_model.h) on hand-worked bytes: ZeRO's stages, the parameter
// counts of a tiny model, the activations a step saves, and MoESys's tiers per layout.
#include <catch2/catch.hpp>

#include "moe/plan/memory_model.h"
#include "support/models.h"

using namespace moe;
using namespace moe::plan;

namespace {

// gpt, 2 MoE layers of 4 experts, D 16, F 32, 2 heads, seq 16, vocab 256, top-2.
ModelConfig tiny() { return test::plan_model_config(); }

ClusterSpec one_node(double device_bytes, double host_bytes, double ssd_bytes) {
  ClusterSpec c;
  c.name = "test";
  c.nodes = 1;
  c.devices_per_node = 4;
  c.device_bytes = device_bytes;
  c.host_bytes = host_bytes;
  c.ssd_bytes = ssd_bytes;
  return c;
}

}  // namespace

TEST_CASE("plan: ZeRO stages shard the dense state as hand-worked", "[plan]") {
  const StateBytes f32 = state_bytes(DType::f32);  // 4 value + 8 AdamW + 4 gradient
  CHECK(f32.total() == 16);
  CHECK(dense_state_bytes(1000, f32, 0, 4) == 16000);
  CHECK(dense_state_bytes(1000, f32, 1, 4) == 8000 + 2000);  // value, grad; 8 / 4
  CHECK(dense_state_bytes(1000, f32, 2, 4) == 4000 + 3000);  // value; (8 + 4) / 4
  CHECK(dense_state_bytes(1000, f32, 3, 4) == 4000);         // 16 / 4
  const StateBytes bf16 = state_bytes(DType::bf16);          // 2 value + 4 master + 8 + 4
  CHECK(bf16.total() == 18);
  CHECK(dense_state_bytes(1000, bf16, 1, 2) == 6000 + 6000);  // (2 + 4); (4 + 8) / 2
}

TEST_CASE("plan: parameter counts and activations of a tiny model", "[plan]") {
  const ModelConfig c = tiny();
  const ParamCounts p = param_counts(c);
  CHECK(p.per_expert == 2 * 16 * 32 + 32 + 16);  // W1, W2 and GPT's biases b1 [F], b2 [D]
  CHECK(p.experts == 8);
  CHECK(p.moe_layers == 2);
  CHECK(p.frozen == 0);  // softmax routers: no selection bias
  // per layer: two LayerNorms 2 x (16 + 16); q, k, v, o 4 x 16 x 16 and their biases 4 x 16;
  // the router 4 x 16
  CHECK(p.block_dense == 64 + 1024 + 64 + 64);
  // the tied token table 256 x 16, GPT's position table 16 x 16, the final LayerNorm 16 + 16
  CHECK(p.dense == 4096 + 256 + 32 + 2 * 1216);
  CHECK(p.total() == 6816 + 8 * 1072);
  CHECK(p.value_bytes(DType::bf16) == 2 * (6816 + 8 * 1072));
  // per layer: 4 bytes x (2 norm inputs + q + k + v + attention output = 6 x 16), 2 heads x 16
  // fp32 probabilities, 2 choices x (input 16 + hidden 2 x 32); then 256 fp32 logits
  CHECK(activation_bytes_per_token(c) == 2 * (4 * 96 + 4 * 32 + 4 * 2 * 80) + 4 * 256);
}

TEST_CASE("plan: the memory plan by tier, and what does not fit", "[plan]") {
  MemoryInput in;
  in.config = tiny();
  in.layout = check_layout(parse_layout("ep=2,zero=1"), 4, {4, 4});
  in.cluster = one_node(300000, 1e9, 0);
  in.tokens_per_rank = 64;
  const MemoryPlan m = plan_memory(in);
  const double dense = 6816 * 8 + 6816 * 8 / 4.0;  // zero=1 over 4 ranks
  const double experts = 4 * 1072 * 16;            // 8 experts / ep 2, 16 bytes per parameter
  const double activations = 64 * 3328.0;
  CHECK(m.need[0] == dense + experts + activations);
  CHECK(m.need[1] == 0);
  CHECK(m.shortfall(0) == dense + experts + activations - 300000);
  CHECK_FALSE(m.fits());

  // ssd: four fp32 slots on the device, a step's experts (alpha 0.5 of 4) cached in host memory,
  // every held expert's state on SSD (the node's SSD shared by its 4 devices).
  in.layout = check_layout(parse_layout("ep=2,offload=ssd"), 4, {4, 4});
  in.active_fraction = 0.5;
  in.cluster = one_node(1e9, 1e9, 4 * 68608 - 4);
  const MemoryPlan s = plan_memory(in);
  CHECK(s.need[0] == 6816 * 16 + 4 * 4 * 1072 + activations);
  CHECK(s.need[1] == 2 * 1072 * 16);
  CHECK(s.need[2] == 4 * 1072 * 16);
  CHECK(s.shortfall(2) == 1);  // 68608 needed, 68607 per device
  CHECK(s.shortfall(1) < 0);

  // One memory (device_kind cpu): the host tier's items count on the device pool.
  in.layout = check_layout(parse_layout("ep=2,offload=host,placement=lpt"), 4, {4, 4});
  in.cluster.device_is_host = true;
  const MemoryPlan h = plan_memory(in);
  CHECK(h.need[1] == 0);
  CHECK(h.need[0] == 6816 * 16 + 4 * 4 * 1072 + 8 * 1072 * 16 + activations);  // lpt: all 8
  // flexmoe: V = ceil(4 / 2) + 1 = 3 slots per layer, 6 experts in all
  in.layout = check_layout(parse_layout("ep=2,placement=flexmoe"), 4, {4, 4});
  CHECK(experts_held_per_rank(in.config, in.layout) == 6);
  in.layout = check_layout(parse_layout("ep=4"), 4, {4, 4});
  CHECK(experts_held_per_rank(in.config, in.layout) == 2);
}
