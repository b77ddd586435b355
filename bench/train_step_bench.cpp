// moe-train-bench: distributed training step time (train::Trainer) per communication setting, run
// under mpiexec: expert-parallel degree, flat or hierarchical all-to-all, gradient reduction after
// backward (scheduler off) or Lina's priority micro-ops overlapping backward. Per setting: the
// mean step time (slowest rank), the time a rank spends blocked in the expert all-to-all and in
// finishing the gradient reduction after backward, tokens/s per rank. The ceiling, measured in the
// same run on the same ranks at the same time, is every rank training its own share of the batch
// as an independent single process (no communication at all); "vs ceiling" = ceiling time / step
// time. Not a test: nothing is asserted.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "common/cli.h"
#include "machine.h"
#include "moe/comm/communicator.h"
#include "moe/threads.h"
#include "moe/train/trainer.h"

using namespace moe;

namespace {

struct Options {
  std::string data = "/usr/share/games/fortunes/linux";
  int64_t steps = 8, warmup = 2, batch_per_rank = 4, d_model = 128, experts = 8, layers = 4;
  int64_t seq = 128;
  double partition_mb = 16.0;
  std::string arch = "mixtral";
};

struct Setting {
  std::string label;
  int64_t ep = 1;
  std::string a2a = "flat", scheduler = "off";
  bool shard_embedding = false;
};

struct Result {
  double step = 0, a2a = 0, a2a_max = 0, sync = 0;
};

double reduce(comm::Communicator& world, double v, comm::ReduceOp op) {
  Tensor t = Tensor::from_vector({1}, std::vector<float>{static_cast<float>(v)});
  world.all_reduce(t, op);
  return t.data<float>()[0];
}

ModelConfig model(const Options& o) {
  ModelConfig m;
  m.arch = parse_arch(o.arch);
  m.layers = o.layers;
  m.d_model = o.d_model;
  m.heads = 4;
  m.kv_heads = m.arch == Arch::mixtral ? 2 : 0;
  m.d_ff = 4 * o.d_model;
  m.seq = o.seq;
  m.experts = o.experts;
  m.moe_every = 1;
  m.top_k = 2;
  m.normalize_topk = m.arch == Arch::mixtral;
  m.resolve();
  return m;
}

train::TrainConfig training(const Options& o, int64_t batch) {
  train::TrainConfig t;
  t.data = o.data;
  t.batch = batch;
  t.steps = o.warmup + o.steps;
  t.warmup = 1;
  t.eval_batches = 1;
  t.partition_mb = o.partition_mb;
  return t;
}

// Mean over the timed steps; each step's time is the slowest rank's.
Result run(train::Trainer& trainer, comm::Communicator& world, const Options& o, bool local) {
  for (int64_t i = 0; i < o.warmup; ++i) trainer.step();
  Result r;
  for (int64_t i = 0; i < o.steps; ++i) {
    world.barrier();
    train::StepStats s = trainer.step();
    r.step += reduce(world, s.seconds, comm::ReduceOp::max);
    if (!local) {
      r.a2a += reduce(world, s.a2a_seconds, comm::ReduceOp::sum) / world.size();
      r.a2a_max += reduce(world, s.a2a_seconds, comm::ReduceOp::max);
      r.sync += reduce(world, s.grad_sync_seconds, comm::ReduceOp::sum) / world.size();
    }
  }
  const double n = static_cast<double>(o.steps);
  return {r.step / n, r.a2a / n, r.a2a_max / n, r.sync / n};
}

int run_bench(const Options& o) {
  auto world = comm::make_world();
  const int W = world->size();
  const bool lead = world->rank() == 0;
  const ModelConfig m = model(o);
  const int64_t tokens_per_rank = o.batch_per_rank * m.seq;

  std::vector<Setting> settings;
  for (int64_t ep = 1; ep <= W; ep *= 2) {
    if (W % ep != 0 || m.experts % ep != 0) continue;
    const std::string dp = std::to_string(W / ep) + "x" + std::to_string(ep);
    for (const char* scheduler : {"off", "priority"}) {
      settings.push_back({"DPxEP " + dp, ep, "flat", scheduler});
      if (ep >= 4) settings.push_back({"DPxEP " + dp, ep, "hierarchical", scheduler});
    }
  }

  if (lead) {
    std::printf("# moe-train-bench: training step time per communication setting, %s\n",
                W > 1 ? "MPI" : "one process");
    std::printf("# %s, %s, %d ranks, %d threads per rank, %s MPI waits\n", bench::now_utc().c_str(),
                bench::cpu_model().c_str(), W, num_threads(),
                comm::wait_mode_name(comm::wait_mode()));
    std::printf(
        "# model: %s, %lld layers (all MoE), d_model %lld, %lld experts top-2, seq %lld; "
        "%lld sequences per rank per step\n",
        o.arch.c_str(), static_cast<long long>(m.layers), static_cast<long long>(m.d_model),
        static_cast<long long>(m.experts), static_cast<long long>(m.seq),
        static_cast<long long>(o.batch_per_rank));
    std::printf(
        "# time = mean over %lld steps after %lld warm-up steps of the slowest rank's step; "
        "a2a = blocked in expert all-to-all\n#   (mean over ranks / slowest rank); sync = "
        "finishing the gradient reduction after backward (mean over ranks)\n",
        static_cast<long long>(o.steps), static_cast<long long>(o.warmup));
    std::printf(
        "# ceiling = every rank training its own %lld sequences as an independent process "
        "(no communication), same time, same ranks\n# hierarchical: virtual nodes of 2 "
        "ranks; priority: --partition-mb %.2f\n#\n",
        static_cast<long long>(o.batch_per_rank), o.partition_mb);
    std::printf("# %-14s %-12s %-9s %9s %9s %9s %9s %11s %8s\n", "setting", "a2a", "scheduler",
                "time", "a2a", "a2a max", "sync", "tok/s/rank", "vs ceil");
    std::printf("# %-14s %-12s %-9s %9s %9s %9s %9s %11s %8s\n", "", "", "", "(ms)", "(ms)", "(ms)",
                "(ms)", "", "(%)");
  }
  double ceiling = 0;
  {
    train::Trainer alone(m, training(o, o.batch_per_rank), {}, nullptr);
    ceiling = run(alone, *world, o, true).step;
  }
  auto row = [&](const std::string& label, const std::string& a2a, const std::string& sched,
                 const Result& r) {
    if (!lead) return;
    std::printf("  %-14s %-12s %-9s %9.1f %9.1f %9.1f %9.1f %11.0f %8.1f\n", label.c_str(),
                a2a.c_str(), sched.c_str(), r.step * 1e3, r.a2a * 1e3, r.a2a_max * 1e3,
                r.sync * 1e3, static_cast<double>(tokens_per_rank) / r.step,
                100.0 * ceiling / r.step);
    std::fflush(stdout);
  };
  row("ceiling", "-", "-", Result{ceiling, 0, 0, 0});
  if (W == 1) return 0;
  for (const Setting& s : settings) {
    train::TrainConfig t = training(o, o.batch_per_rank * W);
    t.ep = s.ep;
    t.a2a = comm::parse_a2a_algorithm(s.a2a);
    t.ranks_per_node = s.a2a == "hierarchical" ? 2 : 0;
    t.comm_scheduler = comm::parse_scheduler_mode(s.scheduler);
    train::Trainer trainer(m, t, {}, world.get());
    row(s.label, s.a2a, s.scheduler, run(trainer, *world, o, false));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "moe-train-bench: distributed training step time per communication setting "
      "(run under mpiexec)",
      "moe-train-bench"};
  Options o;
  tools::CommonOptions common;
  tools::add_common_options(app, common, "moe-train-bench");
  app.add_option("--data", o.data, "Training text")->capture_default_str();
  app.add_option("--steps", o.steps, "Timed steps per setting")
      ->check(tools::positive())
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "Untimed steps first")
      ->check(tools::non_negative())
      ->capture_default_str();
  app.add_option("--batch-per-rank", o.batch_per_rank, "Sequences per rank per step")
      ->check(tools::positive())
      ->capture_default_str();
  app.add_option("--d-model", o.d_model, "Model width")
      ->check(tools::positive())
      ->capture_default_str();
  app.add_option("--experts", o.experts, "Experts per layer")
      ->check(tools::positive())
      ->capture_default_str();
  app.add_option("--layers", o.layers, "Blocks (all MoE)")
      ->check(tools::positive())
      ->capture_default_str();
  app.add_option("--seq", o.seq, "Sequence length")
      ->check(tools::positive())
      ->capture_default_str();
  app.add_option("--partition-mb", o.partition_mb, "Micro-op size with the priority scheduler")
      ->capture_default_str();
  app.add_option("--arch", o.arch, "gpt or mixtral")
      ->check(CLI::IsMember({"gpt", "mixtral"}))
      ->capture_default_str();
  return tools::run_tool("moe-train-bench", app, argc, argv, [&] {
    tools::apply_common_options(common);
    return run_bench(o);
  });
}
