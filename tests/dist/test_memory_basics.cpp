// Gradient accumulation and activation recomputation under data and expert parallelism: the
// recomputed runs are bitwise the plain one and never repeat an exchange they need not; with
// micro-batches the gradient reduction (plain or Lina's priority micro-ops) runs once per step and
// the run follows one process's with the same --grad-accum (micro-batches are rows of the global
// batch, the same on any number of ranks). Runs on 2 and 4 ranks.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "moe/comm/communicator.h"
#include "moe/train/trainer.h"
#include "support/ep_compare.h"
#include "support/models.h"
#include "support/run.h"

moe::comm::Communicator& dist_world();

using namespace moe;
using test::bitwise_equal;

namespace {

ModelConfig model(Arch arch) { return test::ep_model(arch); }

train::TrainConfig config(int64_t ep, int64_t grad_accum, const std::string& recompute) {
  train::TrainConfig t;
  t.data = test::fortunes_path("linux");
  t.batch = 16;
  t.steps = 3;
  t.warmup = 1;
  t.eval_batches = 1;
  t.seed = 13;
  t.ep = ep;
  t.grad_accum = grad_accum;
  t.recompute = nn::parse_recompute(recompute);
  return t;
}

}  // namespace

TEST_CASE("memory: --recompute moe and block train bitwise like none across ranks", "[dist]") {
  comm::Communicator& world = dist_world();
  for (int64_t ep : {int64_t{1}, static_cast<int64_t>(world.size())}) {
    for (Arch arch : {Arch::gpt, Arch::mixtral}) {
      DYNAMIC_SECTION(arch_name(arch) << " --ep " << ep) {
        train::Trainer none(model(arch), config(ep, 2, "none"), {}, &world);
        train::Trainer moe(model(arch), config(ep, 2, "moe"), {}, &world);
        train::Trainer block(model(arch), config(ep, 2, "block"), {}, &world);
        for (int i = 0; i < 3; ++i) {
          const train::StepStats a = none.step(), b = moe.step(), c = block.step();
          REQUIRE(a.forward.total == b.forward.total);
          REQUIRE(a.forward.total == c.forward.total);
          REQUIRE(a.grad_norm == b.grad_norm);
          REQUIRE(a.grad_norm == c.grad_norm);
          if (ep > 1) {
            // 2 micro-batches x 2 MoE layers x (2 forward + 2 backward) exchanges; moe
            // recomputes from the rows it received, block runs each layer's forward again.
            REQUIRE(a.a2a_calls == 2 * 2 * 4);
            REQUIRE(b.a2a_calls == a.a2a_calls);
            REQUIRE(c.a2a_calls == 2 * 2 * 6);
          }
        }
        std::string where;
        const bool same1 = bitwise_equal(none, moe, where);
        const bool same2 = bitwise_equal(none, block, where);
        INFO("first differing parameter: " << where);  // filled by the comparisons
        REQUIRE(same1);
        REQUIRE(same2);
      }
    }
  }
}

TEST_CASE("memory: --grad-accum across ranks follows one process, reducing once per step",
          "[dist]") {
  comm::Communicator& world = dist_world();
  const int64_t ep = world.size();
  train::Trainer plain(model(Arch::mixtral), config(ep, 2, "none"), {}, &world);
  train::TrainConfig priority_config = config(ep, 2, "none");
  priority_config.comm_scheduler = comm::SchedulerMode::priority;
  priority_config.partition_mb = 0.004;  // many micro-ops per block
  train::Trainer priority(model(Arch::mixtral), priority_config, {}, &world);
  train::Trainer single(model(Arch::mixtral), config(1, 2, "none"), {});
  for (int i = 0; i < 3; ++i) {
    const train::StepStats a = plain.step(), b = priority.step(), c = single.step();
    // Gradients packed during the last micro-batch's backward only: had a pass before it been
    // reduced, the priority run would average partial gradients and differ.
    REQUIRE(a.forward.loss == b.forward.loss);
    REQUIRE(a.grad_norm == b.grad_norm);
    // One process on the same global batch: micro-batch m is the same rows of it on any number
    // of ranks (each rank trains its share of them), so the routers' loads summed over the ranks
    // and the aux loss are one process's too; what differs is float32 summation order (3 steps
    // of a few ulps: 1e-5 relative; before micro-batches were global, 1e-3 was needed).
    REQUIRE(a.tokens == c.tokens);
    REQUIRE(a.forward.loss == Approx(c.forward.loss).epsilon(1e-5));
    REQUIRE(a.forward.aux_loss == Approx(c.forward.aux_loss).epsilon(1e-5));
  }
  std::string where;
  const bool same = bitwise_equal(plain, priority, where);
  INFO("first differing parameter: " << where);  // filled by the comparisons
  REQUIRE(same);
}

TEST_CASE("memory: a batch that does not split over ranks x micro-batches is refused everywhere",
          "[dist]") {
  comm::Communicator& world = dist_world();
  train::TrainConfig t = config(1, 3, "none");
  t.batch = 6 * world.size();  // 6 sequences per rank: 3 micro-batches of 2
  REQUIRE_NOTHROW(train::Trainer(model(Arch::gpt), t, {}, &world));
  t.batch = 4 * world.size();  // 4 per rank do not split into 3
  REQUIRE_THROWS_WITH(train::Trainer(model(Arch::gpt), t, {}, &world),
                      Catch::Contains("does not split into --grad-accum 3") &&
                          Catch::Contains("data-parallel ranks"));
}
