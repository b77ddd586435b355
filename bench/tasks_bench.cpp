// moe-tasks-bench: multi-task training throughput per rank (MoESys Table III's comparison), run
// under mpiexec with R ranks. Two tasks whose per-step work is: 1 (batches b and b
// sequences) train the same model under three allocations:
//   one rank per task   the tasks on 2 of the R ranks (the rest idle), each rank a whole task
//   equal               R/2 ranks per task (--task-allocation equal)
//   workload            ranks by tokens per step, n_t = round(R w_t / sum w) (the default)
// Per allocation: the mean step time (slowest rank), samples/s per rank used, the most rows a rank
// computes. The ceiling, measured in the same run on the same ranks, is every rank training b
// sequences of its own as an independent process: the per-rank rate of a perfectly balanced
// split with no communication. "same loss" checks that each allocation computed the objective
// of the first (the allocation changes who computes a row, not the number). Not a test.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/cli.h"
#include "machine.h"
#include "moe/comm/communicator.h"
#include "moe/threads.h"
#include "moe/train/trainer.h"

using namespace moe;

namespace {

struct Options {
  std::string heavy = "/usr/share/games/fortunes/computers";
  std::string light = "/usr/share/games/fortunes/linux";
  int64_t steps = 6, warmup = 2, rows = 4, d_model = 128, experts = 8, layers = 4, seq = 128;
  bool quick = false;
};

double reduce(comm::Communicator& world, double v, comm::ReduceOp op) {
  Tensor t = Tensor::from_vector({1}, std::vector<float>{static_cast<float>(v)});
  world.all_reduce(t, op);
  return t.data<float>()[0];
}

ModelConfig model(const Options& o) {
  ModelConfig m;
  m.arch = Arch::mixtral;
  m.layers = o.layers;
  m.d_model = o.d_model;
  m.heads = 4;
  m.kv_heads = 2;
  m.d_ff = 4 * o.d_model;
  m.seq = o.seq;
  m.experts = o.experts;
  m.moe_every = 1;
  m.top_k = 2;
  m.normalize_topk = true;
  m.resolve();
  return m;
}

train::TrainConfig training(const Options& o) {
  train::TrainConfig t;
  t.steps = o.warmup + o.steps;
  t.warmup = 1;
  t.eval_batches = 1;
  return t;
}

struct Result {
  double step = 0, first_loss = 0;
};

// Mean over the timed steps of the slowest rank's step, over `world`.
Result run(train::Trainer& trainer, comm::Communicator& world, const Options& o) {
  Result r;
  for (int64_t i = 0; i < o.warmup; ++i) {
    const double loss = trainer.step().forward.loss;
    if (i == 0) r.first_loss = loss;
  }
  for (int64_t i = 0; i < o.steps; ++i) {
    world.barrier();
    r.step += reduce(world, trainer.step().seconds, comm::ReduceOp::max);
  }
  r.step /= static_cast<double>(o.steps);
  return r;
}

int run_bench(Options o) {
  if (o.quick) {
    o.steps = 2;
    o.warmup = 1;
    o.d_model = 32;
    o.layers = 2;
    o.seq = 32;
    o.experts = 4;
  }
  auto world = comm::make_world();
  const int R = world->size();
  const bool lead = world->rank() == 0;
  MOE_USAGE_CHECK(R >= 2 && R % 2 == 0,
                  "moe-tasks-bench needs an even number of ranks >= 2 (mpiexec -n 4), got ", R);
  const ModelConfig m = model(o);
  const int64_t heavy_batch = (R - 1) * o.rows, light_batch = o.rows;
  const int64_t samples = heavy_batch + light_batch;
  // The tasks file, written by rank 0 into a scratch directory every rank sees.
  const std::string dir =
      (std::filesystem::temp_directory_path() / "moe-tasks-bench").string() + "-" +
      std::to_string(static_cast<long long>(reduce(*world, lead ? double(::getpid()) : 0,
                                                   comm::ReduceOp::max)));
  const std::string file = dir + "/tasks.toml";
  if (lead) {
    std::filesystem::create_directories(dir);
    std::ofstream(file) << "[[task]]\nname = \"heavy\"\ndata = \"" << o.heavy
                        << "\"\nbatch = " << heavy_batch << "\n\n[[task]]\nname = \"light\"\n"
                        << "data = \"" << o.light << "\"\nbatch = " << light_batch << "\n";
  }
  world->barrier();

  if (lead) {
    std::printf("# moe-tasks-bench: multi-task samples/s per rank by allocation (MoESys §IV-A)\n");
    std::printf("# %s, %s, %d ranks, %d threads per rank%s\n", bench::now_utc().c_str(),
                bench::cpu_model().c_str(), R, num_threads(),
                R * num_threads() > static_cast<int>(std::thread::hardware_concurrency())
                    ? str(", OVERSUBSCRIBED: ", R * num_threads(), " threads on ",
                          std::thread::hardware_concurrency(), " cores")
                          .c_str()
                    : "");
    std::printf(
        "# model: mixtral, %lld layers (all MoE), d_model %lld, %lld experts top-2, seq %lld\n",
        static_cast<long long>(m.layers), static_cast<long long>(m.d_model),
        static_cast<long long>(m.experts), static_cast<long long>(m.seq));
    std::printf("# tasks: heavy batch %lld (%s), light batch %lld (%s); %lld samples per step\n",
                static_cast<long long>(heavy_batch), o.heavy.c_str(),
                static_cast<long long>(light_batch), o.light.c_str(),
                static_cast<long long>(samples));
    std::printf(
        "# time = mean over %lld steps after %lld warm-up steps of the slowest rank's step;\n"
        "# ceiling = every rank training %lld sequences of its own as an independent process\n#\n",
        static_cast<long long>(o.steps), static_cast<long long>(o.warmup),
        static_cast<long long>(o.rows));
    std::printf("# %-18s %6s %10s %10s %9s %13s %8s %9s %9s\n", "allocation", "ranks", "ranks/task",
                "rows max", "time", "samples/s/rank", "vs ceil", "vs equal", "same loss");
    std::printf("# %-18s %6s %10s %10s %9s %13s %8s %9s %9s\n", "", "", "", "", "(ms)", "", "(%)",
                "", "");
  }
  double ceiling = 0;
  {
    train::TrainConfig t = training(o);
    t.data = o.light;
    t.batch = o.rows;
    train::Trainer alone(m, t, {}, nullptr);
    ceiling = run(alone, *world, o).step;
  }
  const double ceiling_rate = static_cast<double>(o.rows) / ceiling;
  double equal_rate = 0, reference_loss = NAN;
  auto row = [&](const std::string& label, int ranks, const train::Trainer* trainer,
                 const Result& r) {
    if (!lead) return;
    std::string split = "-";
    int64_t rows_max = o.rows;
    if (trainer) {
      const train::TaskAllocation& a = trainer->tasks()->allocation();
      split = str(a.ranks_of_task[0], "/", a.ranks_of_task[1]);
      rows_max = 0;
      for (const auto& segments : a.segments) {
        int64_t rows = 0;
        for (const train::TaskSegment& s : segments) rows += s.rows;
        rows_max = std::max(rows_max, rows);
      }
    }
    const double rate =
        trainer ? static_cast<double>(samples) / r.step / ranks : static_cast<double>(o.rows) / r.step;
    if (label == "equal") equal_rate = rate;
    if (trainer && std::isnan(reference_loss)) reference_loss = r.first_loss;
    const bool same = !trainer || std::fabs(r.first_loss - reference_loss) <=
                                      1e-5 * std::fabs(reference_loss);
    std::printf("  %-18s %6d %10s %10lld %9.1f %13.2f %8.1f %9s %9s\n", label.c_str(), ranks,
                split.c_str(), static_cast<long long>(rows_max), r.step * 1e3, rate,
                100.0 * rate / ceiling_rate,
                equal_rate > 0 && trainer ? str(std::round(rate / equal_rate * 100) / 100).c_str()
                                          : "-",
                trainer ? (same ? "yes" : "NO") : "-");
    std::fflush(stdout);
  };
  row("ceiling", R, nullptr, Result{ceiling, 0});
  {
    // One rank per task: ranks 0 and 1 train, the others wait at the barrier below.
    std::unique_ptr<comm::Communicator> pair = world->split(world->rank() < 2 ? 0 : 1,
                                                            world->rank());
    if (world->rank() < 2) {
      train::TrainConfig t = training(o);
      t.tasks = file;
      train::Trainer trainer(m, t, {}, pair.get());
      const Result r = run(trainer, *pair, o);
      row("one rank per task", 2, &trainer, r);
    }
    world->barrier();
  }
  for (const char* allocation : {"equal", "workload"}) {
    train::TrainConfig t = training(o);
    t.tasks = file;
    t.task_allocation = train::parse_allocation_rule(allocation);
    train::Trainer trainer(m, t, {}, world.get());
    const Result r = run(trainer, *world, o);
    row(allocation, R, &trainer, r);
  }
  world->barrier();
  if (lead) std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "moe-tasks-bench: multi-task training samples/s per rank, one rank per task vs equal vs "
      "workload allocation (run under mpiexec -n 4)",
      "moe-tasks-bench"};
  Options o;
  tools::CommonOptions common;
  tools::add_common_options(app, common, "moe-tasks-bench");
  app.add_option("--heavy", o.heavy, "The heavy task's data")->capture_default_str();
  app.add_option("--light", o.light, "The light task's data")->capture_default_str();
  app.add_option("--steps", o.steps, "Timed steps per allocation")
      ->check(tools::positive())
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "Untimed steps first (at least 1: the loss check)")
      ->check(tools::positive())
      ->capture_default_str();
  app.add_option("--rows", o.rows, "b: the light task's batch; the heavy one's is (R-1) b")
      ->check(tools::positive())
      ->capture_default_str();
  app.add_option("--d-model", o.d_model, "Model width")
      ->check(tools::positive())
      ->capture_default_str();
  app.add_option("--layers", o.layers, "Blocks (all MoE)")
      ->check(tools::positive())
      ->capture_default_str();
  app.add_flag("--quick", o.quick, "A small model and 2 timed steps (a smoke run)");
  return tools::run_tool("moe-tasks-bench", app, argc, argv, [&] {
    tools::apply_common_options(common);
    return run_bench(o);
  });
}
