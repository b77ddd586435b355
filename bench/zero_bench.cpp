// moe-zero-bench: one training run under mpiexec with --zero N (ZeRO for the dense parameters,
// parallel::DenseShards), printing one line for bench/zero.sh to tabulate: this run's peak RSS
// (getrusage, the largest over the ranks), the bytes of dense state each rank holds (values and
// their compute copies, gradients, GradSync's fused all-reduce buffer, AdamW masters and moments,
// ZeRO's slices: counted from the tensors the run allocated), tokens/s, and a checksum of the final
// parameters (every tensor's bytes) so the table can show which stages trained the same bits, and
// the overlap of the timed steps (rank 0's seconds: compute waiting for the dense all-gathers and
// the all-gathers themselves, --zero-prefetch; compute waiting for expert uploads and the uploads,
// --offload; bench/zero_prefetch.sh tabulates them). Not a test: nothing is asserted. Shapes: L
// layers, D model width, E experts (every other block MoE).
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "common/cli.h"
#include "moe/comm/communicator.h"
#include "moe/threads.h"
#include "moe/timer.h"
#include "moe/train/trainer.h"

using namespace moe;

namespace {

struct Options {
  std::string data = "/usr/share/games/fortunes/linux";
  int64_t zero = 0, steps = 6, warmup = 2, batch = 8, layers = 4, d_model = 256, experts = 4;
  int64_t seq = 64, zero_prefetch = train::TrainConfig{}.zero_prefetch;
  std::string offload = "none", ssd_dir;
  bool quick = false;
};

// FNV-1a over every parameter's bytes, gathered (--zero 3 holds no whole value; collective).
uint64_t checksum(const train::Trainer& t) {
  uint64_t h = 1469598103934665603ull;
  for (const io::NamedTensor& nt : t.snapshot().params) {
    const auto* b = static_cast<const unsigned char*>(nt.tensor.raw());
    for (size_t i = 0; i < nt.tensor.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

// The largest value over the ranks (as a double: bytes and rates fit).
double max_over(comm::Communicator& world, double v) {
  Tensor t = Tensor::empty({1}, DType::i64);
  t.data<int64_t>()[0] = static_cast<int64_t>(v);
  world.all_reduce(t, comm::ReduceOp::max);
  return static_cast<double>(t.data<int64_t>()[0]);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"moe-zero-bench: one --zero N training run (bench/zero.sh tabulates them)",
               "moe-zero-bench"};
  app.add_option("--zero", o.zero, "ZeRO stage (0, 1, 2, 3)")->capture_default_str();
  app.add_option("--zero-prefetch", o.zero_prefetch, "--zero 3: blocks gathered ahead (0: off)")
      ->capture_default_str();
  app.add_option("--offload", o.offload, "Experts' state: none, host or ssd")
      ->capture_default_str();
  app.add_option("--ssd-dir", o.ssd_dir, "--offload ssd: this rank's files go under DIR");
  app.add_option("--data", o.data, "Training text");
  app.add_option("--steps", o.steps, "Timed steps")->check(tools::positive());
  app.add_option("--d-model", o.d_model, "Model width")->check(tools::positive());
  app.add_option("--layers", o.layers, "Blocks")->check(tools::positive());
  app.add_flag("--quick", o.quick, "A tiny model and two steps (smoke test)");
  return tools::run_tool(
      "moe-zero-bench", app, argc, argv,
      [&] {
        if (o.quick) {
          o.d_model = 64;
          o.layers = 2;
          o.steps = 2;
          o.warmup = 1;
          o.seq = 32;
        }
        set_num_threads(1);
        std::unique_ptr<comm::Communicator> world = comm::make_world();
        ModelConfig m;
        m.arch = Arch::gpt;
        m.layers = o.layers;
        m.d_model = o.d_model;
        m.heads = 4;
        m.d_ff = 4 * o.d_model;
        m.seq = o.seq;
        m.experts = o.experts;
        m.moe_every = 2;
        m.top_k = 2;
        m.resolve();
        train::TrainConfig t;
        t.data = o.data;
        t.batch = o.batch;
        t.steps = o.warmup + o.steps;
        t.warmup = 1;
        t.eval_batches = 1;
        t.zero = o.zero;
        t.zero_prefetch = o.zero_prefetch;
        t.offload.tier = offload::parse_tier(o.offload);
        if (!o.ssd_dir.empty()) t.offload.ssd_dir = str(o.ssd_dir, "/rank-", world->rank());
        train::Trainer trainer(m, t, {}, world.get());
        const parallel::DenseShards* shards = trainer.dense_shards();
        int64_t dense = 0;
        for (const Param* p : std::as_const(trainer.params()).all())
          if (parallel::DenseShards::shardable(*p)) dense += p->numel();
        const int64_t storage = dtype_size(m.dtype), copy = m.dtype == DType::f32 ? 0 : 4;
        // Stage 3 keeps no whole value or gradient between uses (its slices are in state_bytes());
        // one block's gathered values and gradients at a time are transient and not counted.
        const bool sharded_values = shards && shards->stage() >= 3;
        const int64_t values = sharded_values ? 0 : dense * (storage + copy);
        const int64_t grads = sharded_values ? 0 : dense * 4;
        const bool all_reduced = world->size() > 1 && (!shards || shards->stage() < 2);
        const int64_t fused = all_reduced ? dense * 4 : 0;
        const int64_t adam = shards ? shards->state_bytes() : dense * (8 + copy);
        for (int64_t i = 0; i < o.warmup; ++i) trainer.step();
        int64_t tokens = 0;
        Timer timer;
        double dense_wait = 0, dense_gather = 0, expert_wait = 0, expert_load = 0;
        for (int64_t i = 0; i < o.steps; ++i) {
          const train::StepStats s = trainer.step();
          tokens += s.tokens;
          dense_wait += s.dense_wait_seconds;
          dense_gather += s.dense_gather_seconds;
          expert_wait += s.expert_wait_seconds;
          expert_load += s.expert_load_seconds;
        }
        const double tokens_per_s = static_cast<double>(tokens) / timer.seconds();
        struct rusage usage {};
        getrusage(RUSAGE_SELF, &usage);
        const double rss = max_over(*world, static_cast<double>(usage.ru_maxrss) * 1024.0);
        const double state = max_over(*world, static_cast<double>(values + grads + fused + adam));
        const uint64_t sum = checksum(trainer);
        if (world->rank() == 0)
          std::printf(
              "ranks=%d zero=%lld peak_rss=%.0f dense_params=%lld dense_state=%.0f "
              "values=%lld grads=%lld fused=%lld sharded=%lld tokens_per_s=%.1f "
              "checksum=%016llx dense_wait=%.6f dense_gather=%.6f expert_wait=%.6f "
              "expert_load=%.6f\n",
              world->size(), static_cast<long long>(o.zero), rss, static_cast<long long>(dense),
              state, static_cast<long long>(values), static_cast<long long>(grads),
              static_cast<long long>(fused), static_cast<long long>(adam), tokens_per_s,
              static_cast<unsigned long long>(sum), dense_wait, dense_gather, expert_wait,
              expert_load);
        return 0;
      },
      tools::Scope::job);
}
