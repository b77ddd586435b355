// gpt_oss under expert x data parallelism (issue 44, plan Q2): its per-layer parameters that are
// not an expert's - the attention sinks (f32), the q/k/v/o biases and the router's logit bias -
// are replicated and reduced like every dense parameter, the experts' biases b1/b3/b2 sliced with
// their experts; training on 2 and 4 ranks equals one process on the same global batch.
#include <catch2/catch.hpp>

#include "moe/comm/communicator.h"
#include "moe/train/trainer.h"
#include "support/ep_compare.h"
#include "support/models.h"

moe::comm::Communicator& dist_world();

using namespace moe;
using namespace moe::test;

namespace {

// ep_model's gpt_oss with grouped-query heads, a window of 8 on layer 0 and the clamp biting.
ModelConfig gpt_oss_model() {
  ModelConfig c = ep_model(Arch::gpt_oss);
  c.kv_heads = 2;
  c.sliding_window = 8;
  c.window_layers = {0};
  c.normalize_topk = true;
  c.swiglu_limit = 0.5;
  c.resolve();
  return c;
}

}  // namespace

TEST_CASE("ep: gpt_oss trains under expert x data parallelism as in one process", "[dist]") {
  comm::Communicator& world = dist_world();
  for (int64_t ep : {int64_t{1}, int64_t{2}, int64_t{4}}) {
    if (world.size() % ep != 0) continue;
    DYNAMIC_SECTION(world.size() / ep << "-way data x " << ep << "-way expert parallel") {
      train::Trainer parallel(gpt_oss_model(), ep_train(ep), {}, &world);
      train::Trainer single(gpt_oss_model(), ep_train(1), {});
      std::string where;
      REQUIRE(worst_difference(parallel, single, where) == 0);
      // Replicated: the sinks and the router's logit bias; sliced with the experts: b1/b3/b2.
      CHECK(parallel.params().at("blocks.1.attn.sinks").value.shape() == Shape{4});
      CHECK(parallel.params().at("blocks.1.moe.router.logit_bias").value.shape() == Shape{4});
      CHECK(parallel.params().at("blocks.1.moe.experts.b3").value.dim(0) == 4 / ep);
      step_both(parallel, single, 4);
      // The sinks and the router bias moved (their gradients reached them on every rank).
      for (const char* name : {"blocks.0.attn.sinks", "blocks.1.moe.router.logit_bias"}) {
        double moved = 0;
        for (float v : parallel.params().at(name).value.to_vector())
          moved = std::max(moved, double(std::fabs(v)));
        INFO(name);
        CHECK(moved > 0);
      }
      // Tolerance as the other families' (test_expert_parallel.cpp): reduction order only.
      const double worst = worst_difference(parallel, single, where);
      INFO("worst parameter difference relative to its scale: " << worst << " in " << where);
      REQUIRE(worst < 1e-3);
    }
  }
}
