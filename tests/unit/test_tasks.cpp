// Multi-task training's inputs and one-process runs (moe/train/tasks.h): the allocation rule on
// hand-worked workloads, the tasks file's errors, and a one-task run against a plain --data run.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "moe/io/dataset.h"
#include "moe/train/tasks.h"
#include "moe/train/trainer.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;
using train::TaskSpec;

namespace {

std::vector<int64_t> ranks_for(std::vector<double> work, int ranks) {
  return train::workload_ranks(work, ranks);
}

std::vector<TaskSpec> specs(std::vector<int64_t> batches) {
  std::vector<TaskSpec> tasks;
  for (size_t t = 0; t < batches.size(); ++t)
    tasks.push_back({str("t", t), test::fortunes_path("art"), batches[t], 1.0});
  return tasks;
}

std::string error_parsing(const std::string& toml) {
  try {
    train::parse_tasks(toml, "tasks.toml");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("tasks: ranks by workload, worked by hand", "[tasks]") {
  // MoESys's example: shares 4, 2, 1, 1 exactly.
  CHECK(ranks_for({512, 256, 128, 128}, 8) == std::vector<int64_t>{4, 2, 1, 1});
  // Shares 4/3 each round to 1 (sum 3 < 4): the extra rank goes to the lowest index on the tie.
  CHECK(ranks_for({1, 1, 1}, 4) == std::vector<int64_t>{2, 1, 1});
  // Shares 3.33, 0.33, 0.33 -> 3, 1, 1 (sum 5): only task 0 can give a rank back.
  CHECK(ranks_for({10, 1, 1}, 4) == std::vector<int64_t>{2, 1, 1});
  // Shares 2.57, 0.43 -> 3, 1 (sum 4 > 3): task 0 is over-served by 0.43.
  CHECK(ranks_for({6, 1}, 3) == std::vector<int64_t>{2, 1});
  // Shares 1.33 x 4 and 2.67 -> 1, 1, 1, 1, 3 (sum 7 < 8): task 0 is under-served the most (tie).
  CHECK(ranks_for({1, 1, 1, 1, 2}, 8) == std::vector<int64_t>{2, 1, 1, 1, 3});
  // Shares 2.5, 1.5 round half away from zero to 3, 2 (sum 5 > 4): both over by 0.5, lowest first.
  CHECK(ranks_for({5, 3}, 4) == std::vector<int64_t>{2, 2});
  CHECK(ranks_for({7}, 5) == std::vector<int64_t>{5});
  CHECK_THROWS_WITH(ranks_for({1, 1, 1}, 2), Catch::Contains("3 tasks on 2 ranks"));
  CHECK_THROWS_WITH(ranks_for({1, 0}, 2), Catch::Contains("work is 0"));
}

TEST_CASE("tasks: each task's batch splits evenly over its consecutive ranks", "[tasks]") {
  const std::vector<TaskSpec> tasks = specs({4, 2, 2});
  const train::TaskAllocation a = train::allocate_by_tokens(tasks, 16, 4);
  CHECK(a.ranks_of_task == std::vector<int64_t>{2, 1, 1});
  REQUIRE(a.ranks() == 4);
  auto seg = [&](int r) {
    const auto& s = a.segments[static_cast<size_t>(r)];
    REQUIRE(s.size() == 1);
    return std::vector<int64_t>{s[0].task, s[0].first_row, s[0].rows};
  };
  CHECK(seg(0) == std::vector<int64_t>{0, 0, 2});
  CHECK(seg(1) == std::vector<int64_t>{0, 2, 2});
  CHECK(seg(2) == std::vector<int64_t>{1, 0, 2});
  CHECK(seg(3) == std::vector<int64_t>{2, 0, 2});
  CHECK(train::describe(a, tasks) == "t0:2 t1:1 t2:1 ranks");
  const train::TaskAllocation back = train::task_allocation_from_json(train::to_json(a));
  CHECK(train::to_json(back) == train::to_json(a));
  // Batch 3 over the 2 ranks its workload gets: refused, naming the task.
  CHECK_THROWS_WITH(train::allocate_by_tokens(specs({3, 1}), 16, 3),
                    Catch::Contains("task 't0': batch 3 does not split evenly over the 2 ranks"));
}

TEST_CASE("tasks: the equal baseline gives R / T ranks each", "[tasks]") {
  // 2, 2, 12 on 4 ranks: equal 2/1/1 (one left over, to the first); by workload the shares are
  // 0.5, 0.5, 3 -> 1, 1, 3 (sum 5), task 2 gives one back: 1/1/2.
  const std::vector<TaskSpec> tasks = specs({2, 2, 12});
  CHECK(train::allocate_equally(tasks, 4).ranks_of_task == std::vector<int64_t>{2, 1, 1});
  CHECK(train::allocate_by_tokens(tasks, 16, 4).ranks_of_task == std::vector<int64_t>{1, 1, 2});
  CHECK(train::allocate_equally(tasks, 4).segments[1][0].first_row == 1);
  CHECK_THROWS_WITH(train::allocate_equally(tasks, 2), Catch::Contains("3 tasks on 2 ranks"));
}

TEST_CASE("tasks: more tasks than ranks share ranks by LPT", "[tasks]") {
  const std::vector<TaskSpec> tasks = specs({8, 4, 2, 2});
  // 8 -> rank 0; 4 -> rank 1; 2 -> rank 1 (4 < 8); 2 -> rank 1 (6 < 8).
  const train::TaskAllocation a = train::allocate_by_tokens(tasks, 16, 2);
  REQUIRE(a.segments.size() == 2);
  REQUIRE(a.segments[0].size() == 1);
  CHECK(a.segments[0][0].task == 0);
  REQUIRE(a.segments[1].size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(a.segments[1][i].task == static_cast<int64_t>(i + 1));
    CHECK(a.segments[1][i].rows == tasks[i + 1].batch);  // whole batches
  }
  CHECK(train::describe(a, tasks) == "rank 0: t0 | rank 1: t1 t2 t3");
  // One process: every task on rank 0.
  CHECK(train::allocate_by_tokens(tasks, 16, 1).segments[0].size() == 4);
}

TEST_CASE("tasks: a tasks file is read, relative data paths from its directory", "[tasks]") {
  test::ScratchDir dir("tasks-file");
  test::write_file(dir / "a.txt", std::string(400, 'a'));
  test::write_file(dir / "tasks.toml",
                   "[[task]]\nname = \"alpha\"\ndata = \"a.txt\"\nbatch = 4\n\n"
                   "[[task]]\nname = \"beta\"\ndata = \"" +
                       test::fortunes_path("art") + "\"\nbatch = 2\nweight = 0.5\n");
  const std::vector<TaskSpec> tasks = train::read_tasks_file(dir / "tasks.toml");
  REQUIRE(tasks.size() == 2);
  CHECK(tasks[0].name == "alpha");
  CHECK(tasks[0].data == dir / "a.txt");
  CHECK(tasks[0].batch == 4);
  CHECK(tasks[0].weight == 1.0);  // the default
  CHECK(tasks[1].weight == 0.5);
  CHECK_THROWS_WITH(train::read_tasks_file(dir / "missing.toml"),
                    Catch::Contains("missing.toml: cannot open the tasks file"));
}

TEST_CASE("tasks: bad tasks files name the file, the task and the key", "[tasks]") {
  const std::string art = "data = \"" + test::fortunes_path("art") + "\"\n";
  const std::string ok = "[[task]]\nname = \"a\"\n" + art + "batch = 2\n";
  CHECK(error_parsing(ok) == "(no error)");
  CHECK_THAT(error_parsing(ok + "colour = 3\n"),
             Catch::Contains("tasks.toml:5: task 'a': unknown key 'colour'"));
  CHECK_THAT(error_parsing("[[task]]\n" + art + "batch = 2\n"),
             Catch::Contains("task 1: missing key 'name'"));
  CHECK_THAT(error_parsing("[[task]]\nname = \"a\"\nbatch = 2\n"),
             Catch::Contains("task 'a': missing key 'data'"));
  CHECK_THAT(error_parsing("[[task]]\nname = \"a\"\n" + art),
             Catch::Contains("task 'a': missing key 'batch'"));
  CHECK_THAT(error_parsing(ok + ok), Catch::Contains("task 'a' is defined twice"));
  for (const char* batch : {"0", "-3", "1.5", "\"4\""})
    CHECK_THAT(error_parsing("[[task]]\nname = \"a\"\n" + art + "batch = " + batch + "\n"),
               Catch::Contains("tasks.toml:4: task 'a': 'batch' must be an integer >= 1"));
  for (const char* weight : {"0", "-1", "inf", "nan", "\"heavy\""})
    CHECK_THAT(error_parsing(ok + "weight = " + weight + "\n"),
               Catch::Contains("task 'a': 'weight' must be a finite number > 0"));
  CHECK_THAT(error_parsing("[[task]]\nname = \"a b\"\n" + art + "batch = 2\n"),
             Catch::Contains("name 'a b' must be letters"));
  CHECK_THAT(error_parsing("[[task]]\nname = \"a\"\ndata = \"/nonexistent/x.txt\"\nbatch = 2\n"),
             Catch::Contains("task 'a': data file '/nonexistent/x.txt' does not exist"));
  CHECK_THAT(error_parsing("[[task]\nname = 1\n"), Catch::Contains("tasks.toml:1:"));
  CHECK_THAT(error_parsing("[[task]\nname = 1\n"), Catch::Contains("not valid TOML"));
  CHECK_THAT(error_parsing(""), Catch::Contains("tasks.toml: no task"));
  CHECK_THAT(error_parsing("steps = 3\n" + ok), Catch::Contains("unknown key 'steps'"));
  CHECK_THAT(error_parsing("[task]\nname = \"a\"\n"),
             Catch::Contains("write each task as [[task]]"));
}

TEST_CASE("tasks: one task of weight 1 trains bitwise as --data does", "[tasks]") {
  // Same file, batch and seed: the task's sampler is the plain run's (seed + 0) and its loss
  // scale is 1, so every step computes the same numbers.
  test::ScratchDir dir("tasks-one");
  test::write_file(dir / "tasks.toml", "[[task]]\nname = \"c\"\ndata = \"" +
                                           test::fortunes_path("computers") + "\"\nbatch = 4\n");
  ModelConfig model = test::small_model_config(Arch::gpt);
  model.resolve();
  train::TrainConfig plain;
  plain.data = test::fortunes_path("computers");
  plain.batch = 4;
  plain.steps = 3;
  plain.seed = 5;
  train::TrainConfig tasks = plain;
  tasks.data.clear();
  tasks.tasks = dir / "tasks.toml";
  train::Trainer a(model, plain, {}), b(model, tasks, {});
  for (int i = 0; i < 3; ++i) {
    const train::StepStats sa = a.step(), sb = b.step();
    CHECK(sa.forward.loss == sb.forward.loss);
    REQUIRE(sb.tasks.size() == 1);
    CHECK(sb.tasks[0].loss == Approx(sb.forward.loss).epsilon(1e-12));
    CHECK(sb.tasks[0].samples == 4);
  }
  for (Param* p : a.params().all())
    CHECK(std::memcmp(p->value.raw(), b.params().at(p->name).value.raw(), p->value.nbytes()) == 0);
  CHECK(a.evaluate() == b.evaluate());
  // --data with --tasks, and what tasks do not combine with, are refused by name.
  train::TrainConfig both = tasks;
  both.data = plain.data;
  CHECK_THROWS_WITH(train::Trainer(model, both, {}), Catch::Contains("replaces --data"));
  train::TrainConfig accum = tasks;
  accum.grad_accum = 2;
  CHECK_THROWS_WITH(train::Trainer(model, accum, {}),
                    Catch::Contains("--tasks does not combine with --grad-accum 2"));
}

TEST_CASE("tasks: the step's gradient is the weighted objective's", "[tasks]") {
  // Oracle: each task's batch in its own pass of a fresh model with the same initial parameters,
  // the plain cross-entropy scaled by lambda_t B_t / sum B (the mean over a task's rows times its
  // share), gradients accumulated. The router losses are off: their f_e depends on which rows
  // share a pass, so they are not additive over passes.
  test::ScratchDir dir("tasks-gradient");
  test::write_file(dir / "tasks.toml",
                   str("[[task]]\nname = \"a\"\ndata = \"", test::fortunes_path("computers"),
                       "\"\nbatch = 4\nweight = 1.0\n[[task]]\nname = \"b\"\n"
                       "data = \"",
                       test::fortunes_path("linux"), "\"\nbatch = 2\nweight = 3.0\n"));
  ModelConfig model = test::small_model_config(Arch::gpt);
  model.aux_loss_coef = 0;
  model.z_loss_coef = 0;
  model.resolve();
  train::TrainConfig config;
  config.tasks = dir / "tasks.toml";
  config.steps = 1;
  config.clip = 0;  // the gradients stay as computed
  config.seed = 3;
  train::Trainer trainer(model, config, {});
  const train::StepStats stats = trainer.step();

  ParamSet params(config.seed, model.dtype);
  Transformer oracle(model, params, nullptr);
  params.zero_grad();
  const std::vector<std::pair<std::string, double>> tasks{{"computers", 1.0}, {"linux", 3.0}};
  const int64_t batches[] = {4, 2};
  double objective = 0;
  int64_t first_row = 0;
  for (size_t t = 0; t < 2; ++t) {
    std::vector<int32_t> tokens =
        io::split_tail(io::load_tokens(test::fortunes_path(tasks[t].first)), config.val_fraction,
                       model.seq)
            .first;
    io::BatchSampler sampler(&tokens, model.seq, config.seed + t, true);
    Tensor ids, targets;
    sampler.next(batches[t], ids, targets);
    nn::RouterStep rs;
    rs.seed = config.seed;
    rs.first_token = first_row * model.seq;
    TrainPass pass;
    const double share = tasks[t].second * double(batches[t]) / 6.0;
    pass.loss_scale = static_cast<float>(share);
    objective += share * oracle.forward_backward(ids, targets, rs, pass).loss;
    first_row += batches[t];
  }
  CHECK(stats.forward.loss == Approx(objective).epsilon(1e-6));
  double worst = 0;
  std::string worst_name;
  for (Param* p : trainer.params().all()) {
    // The key bias's exact gradient is zero (softmax cancels it): what backward leaves is noise.
    if (p->name.ends_with("attn.k.bias")) continue;
    const std::vector<float> x = p->grad.to_vector(), y = params.at(p->name).grad.to_vector();
    double scale = 0, diff = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      scale = std::max(scale, std::fabs(double(y[i])));
      diff = std::max(diff, std::fabs(double(x[i]) - y[i]));
    }
    if (scale > 0 && diff / scale > worst) {
      worst = diff / scale;
      worst_name = p->name;
    }
  }
  INFO("worst gradient difference relative to its tensor's largest: " << worst << " in "
                                                                      << worst_name);
  // fp32 sums over other row groupings (~1e-6 relative); a weight or share off by any factor is
  // a relative difference of order 1.
  CHECK(worst < 1e-4);
}
