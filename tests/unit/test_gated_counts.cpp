// Gated experts beyond SwiGLU (gpt-oss's clamped SwiGLU), the up projection's bias b3 and the
// router's logit bias, where the library counts or slices parameters outside the layers:
// - moe-plan's parameter counts (plan/param_count.cpp, given a flavour) equal the parameters the
//   nn layers create: one expert's (w1, w2, w3, b1, b2, b3) and one MoE block's dense part
//   (attention, norms, the router's weight and logit bias), for gelu, swiglu and swiglu_clamped,
//   with and without biases;
// - distillation cuts the router's logit bias to the kept experts, as it cuts the router's rows.
// Counts are integers far below 2^53: compared exactly.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "moe/models/flavour.h"
#include "moe/nn/block.h"
#include "moe/nn/moe_layer.h"
#include "moe/plan/memory_model.h"
#include "moe/train/distill.h"
#include "support/gradcheck.h"
#include "support/models.h"

using namespace moe;

namespace {

struct Counted {
  double expert = 0, dense = 0, moe_dense = 0;  // moe_dense: the non-expert ones under ".moe."
};

Counted count(const ParamSet& ps) {
  Counted c;
  for (const Param* p : ps.all()) {
    const double n = double(p->logical_numel());
    (p->expert ? c.expert : c.dense) += n;
    if (!p->expert && p->name.find(".moe.") != std::string::npos) c.moe_dense += n;
  }
  return c;
}

// The MoE layer a gpt-oss block holds (nn level: the Block cannot ask for a logit bias yet).
nn::MoEConfig moe_config(const ModelConfig& c, const Flavour& f) {
  nn::MoEConfig m;
  m.router.d_model = c.d_model;
  m.router.num_experts = c.experts;
  m.router.top_k = c.top_k;
  m.router.normalize_topk = c.normalize_topk;
  m.router.logit_bias = f.router_logit_bias;
  m.experts = nn::ExpertsConfig{c.experts, c.d_model, c.d_ff, f.activation, f.bias};
  return m;
}

// Block 0 of `c` with `f`'s choices, as models/transformer.cpp fills a BlockConfig.
nn::BlockConfig block_config(const ModelConfig& c, const Flavour& f) {
  nn::BlockConfig b;
  b.layers = c.layers;
  b.d_model = c.d_model;
  b.heads = c.heads;
  b.kv_heads = c.kv_heads_resolved();
  b.d_ff = c.d_ff;
  b.head_dim = c.head_dim_resolved();
  b.experts = c.experts_per_layer.at(0);
  b.top_k = c.top_k;
  b.normalize_topk = c.normalize_topk;
  b.norm_eps = c.norm_eps;
  b.rope_theta = c.rope_theta;
  b.norm = f.norm;
  b.activation = f.activation;
  b.bias = f.bias;
  b.learned_positions = f.learned_positions;
  b.qk_norm = f.qk_norm;
  b.qkv_bias = f.qkv_bias;
  return b;
}

}  // namespace

TEST_CASE("gated counts: moe-plan counts the parameters gated experts with biases create",
          "[gated-counts][plan]") {
  struct Case {
    const char* name;
    Activation activation;
    bool bias, logit_bias;
  };
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.resolve();
  REQUIRE(c.experts_per_layer.at(0) == c.experts);
  for (const Case& k :
       {Case{"gelu, biases", Activation::gelu, true, false},
        Case{"swiglu, biases (b3 too)", Activation::swiglu, true, false},
        Case{"gpt-oss: swiglu_clamped, biases, logit bias", Activation::swiglu_clamped, true, true},
        Case{"swiglu_clamped, no biases", Activation::swiglu_clamped, false, false},
        Case{"swiglu, logit bias only", Activation::swiglu, false, true}}) {
    INFO(k.name);
    Flavour f = flavour_of(c);
    f.activation = k.activation;
    f.bias = k.bias;
    f.router_logit_bias = k.logit_bias;
    const plan::ParamCounts p = plan::param_counts(c, f);

    ParamSet layer_ps(1);
    layer_ps.skip_initial_values(true);  // shapes only
    const nn::MoELayer layer(layer_ps, "blocks.0.moe", moe_config(c, f));
    const Counted layer_counts = count(layer_ps);
    REQUIRE((layer_ps.find("blocks.0.moe.experts.b3") != nullptr) ==
            (k.bias && gated(k.activation)));
    REQUIRE((layer_ps.find("blocks.0.moe.router.logit_bias") != nullptr) == k.logit_bias);
    CHECK(p.per_expert * double(c.experts) == layer_counts.expert);
    CHECK(p.experts == c.layers * c.experts);

    // The block's dense part: the Block's own (attention, norms, its router) with its MoE layer's
    // dense parameters replaced by those of the layer above (which has the logit bias).
    ParamSet block_ps(2);
    block_ps.skip_initial_values(true);
    const nn::Block block(block_ps, block_config(c, f), 0);
    const Counted block_counts = count(block_ps);
    CHECK(block_counts.expert == layer_counts.expert);
    CHECK(p.block_dense == block_counts.dense - block_counts.moe_dense + layer_counts.moe_dense);
    CHECK(p.frozen == 0);
  }
}

TEST_CASE("gated counts: distillation keeps the router logit bias of the kept experts",
          "[gated-counts][distill]") {
  ModelConfig teacher_config = test::small_model_config(Arch::mixtral);
  teacher_config.layers = 1;
  teacher_config.resolve();
  const int64_t E = teacher_config.experts;
  Flavour f = flavour_of(teacher_config);
  f.activation = Activation::swiglu_clamped;
  f.bias = true;
  f.router_logit_bias = true;
  ParamSet teacher(3);
  const nn::MoELayer layer(teacher, "blocks.0.moe", moe_config(teacher_config, f));
  uint64_t seed = 100;
  for (Param* p : teacher.all()) {  // distinct values in every row
    p->value.copy_from(test::random_tensor(p->value.shape(), ++seed));
    p->refresh_compute();
  }
  train::StudentPlan plan;
  plan.layers = {0};
  plan.experts = {{1, 3}};
  const std::vector<io::NamedTensor> student = train::student_params(teacher, teacher_config, plan);
  REQUIRE(student.size() == teacher.size());
  bool saw_logit_bias = false;
  for (const io::NamedTensor& nt : student) {
    INFO(nt.name);
    const Param& from = teacher.at(nt.name);  // one layer, kept at its index
    REQUIRE(from.value.dim(0) == E);          // every parameter of the layer is per expert
    REQUIRE(nt.tensor.dim(0) == 2);
    const size_t row = from.value.nbytes() / size_t(E);
    for (size_t i = 0; i < plan.experts[0].size(); ++i)
      CHECK(std::memcmp(static_cast<const std::byte*>(nt.tensor.raw()) + i * row,
                        static_cast<const std::byte*>(from.value.raw()) + plan.experts[0][i] * row,
                        row) == 0);
    saw_logit_bias |= nt.name == "blocks.0.moe.router.logit_bias";
  }
  CHECK(saw_logit_bias);
}
