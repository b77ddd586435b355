// Multi-task training (moe/train/tasks.h) over the world against the same weighted objective in
// one process, and its exact resume. Three tasks: on 4 ranks the workload allocation gives the
// heavy task 2 ranks (rows split 2 x 2), on 2 ranks light tasks share a rank.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "moe/comm/communicator.h"
#include "moe/io/checkpoint.h"
#include "moe/train/trainer.h"
#include "support/ep_compare.h"
#include "support/models.h"
#include "support/run.h"

moe::comm::Communicator& dist_world();
std::string dist_scratch_dir(const std::string& name);

using namespace moe;

namespace {

ModelConfig tasks_model() {
  // Dropless and jitter-free as the data-parallel test (capacity is per rank).
  ModelConfig c = test::small_model_config(Arch::gpt);
  c.resolve();
  return c;
}

// Rank 0 writes the tasks file into `dir` (every rank reads it after the barrier).
train::TrainConfig tasks_train(comm::Communicator& world, const std::string& dir) {
  if (world.rank() == 0) {
    std::filesystem::create_directories(dir);
    test::write_file(
        dir + "/tasks.toml",
        str("[[task]]\nname = \"computers\"\ndata = \"", test::fortunes_path("computers"),
            "\"\nbatch = 4\nweight = 1.0\n\n"
            "[[task]]\nname = \"linux\"\ndata = \"",
            test::fortunes_path("linux"),
            "\"\nbatch = 2\nweight = 0.5\n\n"
            "[[task]]\nname = \"art\"\ndata = \"",
            test::fortunes_path("art"), "\"\nbatch = 2\nweight = 2.0\n"));
  }
  world.barrier();
  train::TrainConfig t;
  t.tasks = dir + "/tasks.toml";
  t.steps = 5;
  t.warmup = 2;
  t.eval_batches = 2;
  t.seed = 7;
  return t;
}

}  // namespace

TEST_CASE("tasks: a multi-task run equals the same weighted objective in one process", "[dist]") {
  comm::Communicator& world = dist_world();
  const std::string dir = dist_scratch_dir("moe-dist-tasks");
  train::TrainConfig config = tasks_train(world, dir);
  // Expert parallelism too: the all-to-all carries each rank's own number of rows.
  config.ep = GENERATE(1, 2);
  INFO("--ep " << config.ep);
  train::Trainer parallel(tasks_model(), config, {}, &world);
  config.ep = 1;
  train::Trainer single(tasks_model(), config, {});
  if (world.size() == 4)
    CHECK(parallel.tasks()->allocation().ranks_of_task == std::vector<int64_t>{2, 1, 1});
  for (int i = 0; i < 5; ++i) {
    const train::StepStats a = parallel.step(), b = single.step();
    // Per-rank sums, then across ranks, and GEMMs over other row counts: rounding differs.
    CHECK(a.forward.loss == Approx(b.forward.loss).epsilon(1e-5));
    CHECK(a.forward.aux_loss == Approx(b.forward.aux_loss).epsilon(1e-5));
    CHECK(a.forward.z_loss == Approx(b.forward.z_loss).epsilon(1e-4));
    CHECK(a.grad_norm == Approx(b.grad_norm).epsilon(1e-4));
    // CHECK, not REQUIRE: a rank leaving here would hang the others in the next collective.
    CHECK(a.tasks.size() == 3);
    CHECK(b.tasks.size() == 3);
    double objective = 0;
    for (size_t t = 0; t < std::min(a.tasks.size(), b.tasks.size()); ++t) {
      CHECK(a.tasks[t].loss == Approx(b.tasks[t].loss).epsilon(1e-5));
      objective += parallel.tasks()->tasks()[t].weight * a.tasks[t].loss *
                   static_cast<double>(a.tasks[t].samples);
    }
    // The reported loss is the objective sum_t lambda_t sum_s loss_s / sum_t B_t.
    CHECK(a.forward.loss == Approx(objective / 8).epsilon(1e-6));
  }
  std::string where;
  const double worst = test::worst_difference(parallel, single, where);  // slices under --ep
  INFO("worst parameter difference relative to its scale: " << worst << " in " << where);
  // The data-parallel test's bound: Adam turns ~1e-7 gradient rounding into ~1e-4 after 5 steps;
  // a wrong weighting (a task's lambda or rows off by any factor) moves parameters by lr-sized
  // steps, far above it.
  CHECK(worst < 1e-3);
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("tasks: a multi-task run resumes bitwise (cursors and allocation)", "[dist]") {
  comm::Communicator& world = dist_world();
  const std::string dir = dist_scratch_dir("moe-dist-tasks-resume");
  if (world.rank() == 0) std::filesystem::remove_all(dir);
  train::TrainConfig config = tasks_train(world, dir);
  // --ep 2 writes a sharded checkpoint directory (rank 0's file holds the task state).
  config.ep = GENERATE(1, 2);
  INFO("--ep " << config.ep);
  train::Trainer straight(tasks_model(), config, {}, &world);
  std::vector<double> losses;
  for (int i = 0; i < 4; ++i) losses.push_back(straight.step().forward.loss);
  train::Trainer first(tasks_model(), config, {}, &world);
  for (int i = 0; i < 2; ++i) first.step();
  const std::string path = first.save(dir + "/run");
  const io::Checkpoint head =
      io::load_checkpoint(std::filesystem::is_directory(path) ? path + "/rank-00000.h5" : path);
  CHECK(head.train_config.contains("tasks_state"));
  if (head.train_config.contains("tasks_state"))
    CHECK(head.train_config["tasks_state"]["cursors"] == nlohmann::json{8, 4, 4});
  train::Trainer resumed(tasks_model(), config, {}, &world);
  resumed.restore(path);
  for (int i = 2; i < 4; ++i) CHECK(resumed.step().forward.loss == losses[size_t(i)]);
  std::string where;
  const bool same = test::bitwise_equal(straight, resumed, where);
  INFO("first parameter that differs: " << where);
  CHECK(same);
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("tasks: a replan every step keeps every rank on one valid allocation", "[dist]") {
  comm::Communicator& world = dist_world();
  const std::string dir = dist_scratch_dir("moe-dist-tasks-replan");
  train::TrainConfig config = tasks_train(world, dir);
  config.task_replan_every = 1;
  train::Trainer trainer(tasks_model(), config, {}, &world);
  for (int i = 0; i < 4; ++i) {
    const train::StepStats s = trainer.step();
    // Measured times differ per rank; the sums every rank computes from them do not.
    const train::TaskAllocation& a = trainer.tasks()->allocation();
    CHECK_NOTHROW(world.check_same_everywhere("task allocation", train::to_json(a).dump()));
    CHECK_NOTHROW(world.check_same_everywhere("task replan", s.task_replan));
    int64_t ranks = 0;
    for (int64_t n : a.ranks_of_task) ranks += n;
    if (world.size() >= 3) CHECK(ranks == world.size());
    // Every task's rows are computed once: per task, the rows over all ranks are its batch.
    std::vector<int64_t> rows(3, 0);
    for (const auto& segments : a.segments)
      for (const train::TaskSegment& seg : segments)
        rows[static_cast<size_t>(seg.task)] += seg.rows;
    CHECK(rows == std::vector<int64_t>{4, 2, 2});
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}
