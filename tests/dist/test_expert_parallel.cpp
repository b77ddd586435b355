// Expert parallelism, hierarchical all-to-all, the priority scheduler and the sharded embedding in
// train::Trainer, against one process training on the same global batch, on every rank.
// Runs on 2 ranks (EP=2; DP=2) and 4 ranks (EP=4; DP2 x EP2; DP=4).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "moe/comm/communicator.h"
#include "moe/train/trainer.h"
#include "support/ep_compare.h"
#include "support/models.h"
#include "support/run.h"

moe::comm::Communicator& dist_world();
std::string dist_scratch_dir(const std::string& name);

using namespace moe;

using namespace moe::test;

TEST_CASE("ep: expert x data parallel training equals one process on the same global batch",
          "[dist]") {
  comm::Communicator& world = dist_world();
  for (int64_t ep : {int64_t{1}, int64_t{2}, int64_t{4}}) {
    if (world.size() % ep != 0) continue;
    // qwen3_moe and qwen2_moe: the qk-norm weights and q/k/v biases are reduced like every
    // dense parameter.
    for (Arch arch : {Arch::gpt, Arch::mixtral, Arch::qwen3_moe, Arch::qwen2_moe}) {
      DYNAMIC_SECTION(arch_name(arch) << ", " << world.size() / ep << "-way data x " << ep
                                      << "-way expert parallel") {
        train::Trainer parallel(ep_model(arch), ep_train(ep), {}, &world);
        train::Trainer single(ep_model(arch), ep_train(1), {});
        // The experts this rank holds, with the single process's initial values.
        std::string where;
        REQUIRE(worst_difference(parallel, single, where) == 0);
        const Param& w1 = parallel.params().at("blocks.0.moe.experts.w1");
        REQUIRE(w1.value.dim(0) == 4 / ep);
        step_both(parallel, single, 4);
        const double worst = worst_difference(parallel, single, where);
        INFO("worst parameter difference relative to its scale: " << worst << " in " << where);
        REQUIRE(worst < 1e-3);
      }
    }
  }
}

TEST_CASE("ep: hierarchical all-to-all and the priority scheduler give bitwise the same run",
          "[dist]") {
  comm::Communicator& world = dist_world();
  const int64_t ep = world.size();
  train::TrainConfig base = ep_train(ep);
  train::Trainer flat(ep_model(Arch::mixtral), base, {}, &world);
  train::TrainConfig hier_config = base;
  hier_config.a2a = comm::A2AAlgorithm::hierarchical;
  hier_config.ranks_per_node = world.size() >= 4 ? 2 : 1;  // 2 virtual nodes of 2 ranks on 4
  train::Trainer hier(ep_model(Arch::mixtral), hier_config, {}, &world);
  train::TrainConfig priority_config = base;
  priority_config.comm_scheduler = comm::SchedulerMode::priority;
  priority_config.partition_mb = 0.004;  // a few KiB: many micro-ops per block
  train::Trainer priority(ep_model(Arch::mixtral), priority_config, {}, &world);
  for (int i = 0; i < 3; ++i) {
    train::StepStats a = flat.step();
    train::StepStats b = hier.step();
    train::StepStats c = priority.step();
    REQUIRE(a.forward.loss == b.forward.loss);
    REQUIRE(a.forward.loss == c.forward.loss);
    REQUIRE(a.grad_norm == b.grad_norm);
    REQUIRE(a.grad_norm == c.grad_norm);
    REQUIRE(a.a2a_calls == 4 * 2);  // 2 MoE layers x (2 forward + 2 backward)
  }
  std::string where;
  const bool same1 = bitwise_equal(flat, hier, where);
  const bool same2 = bitwise_equal(flat, priority, where);
  INFO("first differing parameter: " << where);  // filled by the comparisons
  REQUIRE(same1);
  REQUIRE(same2);
}

TEST_CASE("ep: the sharded embedding trains the same model as the replicated one", "[dist]") {
  comm::Communicator& world = dist_world();
  for (int64_t ep : {int64_t{1}, int64_t{2}}) {
    DYNAMIC_SECTION("ep " << ep) {
      train::TrainConfig sharded_config = ep_train(ep);
      sharded_config.shard_embedding = true;
      train::Trainer sharded(ep_model(Arch::mixtral), sharded_config, {}, &world);
      train::Trainer replicated(ep_model(Arch::mixtral), ep_train(ep), {}, &world);
      const Param& table = sharded.params().at("embed.tokens");
      REQUIRE(table.value.dim(1) == 32 / world.size());
      step_both(sharded, replicated, 3);
      // Only the table's gradient is summed in another order (token by token over the global
      // batch instead of per rank, then across ranks).
      std::string where;
      const double worst = worst_difference(sharded, replicated, where);
      INFO("worst parameter difference relative to its scale: " << worst << " in " << where);
      REQUIRE(worst < 1e-3);
    }
  }
}

TEST_CASE("ep: bad layouts are refused with the flag to change", "[dist]") {
  comm::Communicator& world = dist_world();
  train::TrainConfig t = ep_train(3);
  REQUIRE_THROWS_WITH(train::Trainer(ep_model(Arch::gpt), t, {}, &world),
                      Catch::Contains("--ep 3 does not divide"));
  ModelConfig odd = test::small_model_config(Arch::gpt);
  odd.experts = 3;
  odd.top_k = 1;
  odd.resolve();
  REQUIRE_THROWS_WITH(train::Trainer(odd, ep_train(world.size()), {}, &world),
                      Catch::Contains("experts do not divide over --ep"));
  train::TrainConfig nodes = ep_train(world.size());
  nodes.a2a = comm::A2AAlgorithm::hierarchical;
  nodes.ranks_per_node = 3;
  REQUIRE_THROWS_WITH(train::Trainer(ep_model(Arch::gpt), nodes, {}, &world),
                      Catch::Contains("--ranks-per-node 3 does not divide the --ep"));
  train::TrainConfig tied = ep_train(1);
  tied.shard_embedding = true;
  REQUIRE_THROWS_WITH(train::Trainer(ep_model(Arch::gpt), tied, {}, &world),
                      Catch::Contains("--shard-embedding needs an untied LM head"));
}

TEST_CASE("ep: a sharded checkpoint resumes bitwise, and on another layout too", "[dist]") {
  comm::Communicator& world = dist_world();
  const std::string dir = dist_scratch_dir("moe-dist-ep-ckpt");
  if (world.rank() == 0) std::filesystem::remove_all(dir);
  world.barrier();
  train::TrainConfig t = ep_train(world.size() >= 4 ? 2 : world.size());
  t.shard_embedding = true;
  t.comm_scheduler = comm::SchedulerMode::priority;
  train::Trainer straight(ep_model(Arch::mixtral), t, {}, &world);
  for (int i = 0; i < 4; ++i) straight.step();
  std::string path;
  {
    train::Trainer first(ep_model(Arch::mixtral), t, {}, &world);
    for (int i = 0; i < 2; ++i) first.step();
    path = first.save(dir);
  }
  REQUIRE(std::filesystem::is_directory(path));
  REQUIRE(std::filesystem::read_symlink(dir + "/last") == "step-00000002");
  train::Trainer resumed(ep_model(Arch::mixtral), t, {}, &world);
  resumed.restore(dir + "/last");
  REQUIRE(resumed.steps_done() == 2);
  for (int i = 0; i < 2; ++i) resumed.step();
  std::string where;
  const bool same = bitwise_equal(straight, resumed, where);
  INFO("first differing parameter: " << where);  // filled by the comparisons
  REQUIRE(same);

  // Another layout re-shards it on load (the files merged in memory): the same state as one
  // process resuming the same directory, and it trains on as that process does.
  train::TrainConfig other = t;
  other.ep = 1;
  train::Trainer moved(ep_model(Arch::mixtral), other, {}, &world);
  moved.restore(path);
  train::Trainer single(ep_model(Arch::mixtral), ep_train(1), {});
  single.restore(path);
  REQUIRE(moved.steps_done() == 2);
  REQUIRE(single.steps_done() == 2);
  REQUIRE(worst_difference(moved, single, where) == 0);
  step_both(moved, single, 2);
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

// moe-train --init (Trainer::initialize): a sharded checkpoint's weights start a fresh run on any
// layout. Expert parallel and one process take the same values (the slices of the same tensors),
// start at step 0 with fresh moments, and train on alike.
TEST_CASE("ep: initialize from a sharded checkpoint starts every layout from the same weights",
          "[dist]") {
  comm::Communicator& world = dist_world();
  const std::string dir = dist_scratch_dir("moe-dist-ep-init");
  if (world.rank() == 0) std::filesystem::remove_all(dir);
  world.barrier();
  const int64_t ep = world.size() >= 4 ? 2 : world.size();
  ModelConfig model = ep_model(Arch::qwen2_moe);  // q/k/v biases, a gated shared expert
  model.shared_expert_ff = 16;
  model.resolve();
  std::string path;
  {
    train::Trainer first(model, ep_train(ep), {}, &world);
    for (int i = 0; i < 2; ++i) first.step();
    path = first.save(dir);
  }
  train::TrainConfig t = ep_train(ep);
  t.seed = 99;  // a run of its own: another seed, another data order
  train::Trainer parallel(model, t, {}, &world);
  parallel.initialize(path);
  train::TrainConfig one = ep_train(1);
  one.seed = 99;
  train::Trainer single(model, one, {});
  single.initialize(path);
  // CHECK, not REQUIRE, before the collective steps: a rank that left would hang the others.
  CHECK(parallel.steps_done() == 0);
  CHECK(single.steps_done() == 0);
  std::string where;
  CHECK(worst_difference(parallel, single, where) == 0);
  // The weights are the checkpoint's, not a fresh initialisation's.
  train::Trainer fresh(model, one, {});
  CHECK(worst_difference(single, fresh, where) > 0);
  step_both(parallel, single, 2);
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}
