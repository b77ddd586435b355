// moe-offload-bench: inference throughput of expert offload through the ring memory
// (offload::ExpertRing, MoESys §III-C2) against the fully resident model, on the CPU backend.
// It builds a model whose experts exceed the budgets (untrained: the seed's parameters), saves it
// to a scratch directory, and times Transformer::evaluate over the same batches for: the resident
// model; the ring at 50% and 25% of the expert bytes; naive on-demand loading (no overlap) at 25%.
// Storage reads are made real: the checkpoint's pages are dropped from the page cache
// (fsync + posix_fadvise(POSIX_FADV_DONTNEED)) before each pass and, while the passes run, by a
// thread every --drop-ms (the ring's prefetch of the next pass would otherwise read pages the pass
// just brought in; much shorter intervals evict readahead before HDF5 consumes it, and the device
// then serves the same bytes twice); the header checks that this works (cold vs warm read of the
// file, and the bytes the kernel fetched from the device, /proc/self/io read_bytes). Two regimes: a
// batch where per-layer compute exceeds per-layer load (the ring should hide the loads: MoESys Fig.
// 12 asks >= 90% of resident), and a small batch where loading dominates (bandwidth-bound: nothing
// can hide the loads, every offload row runs at the storage's pace). Not a test: nothing is
// asserted. Shapes: L layers (all MoE), D model width, F expert hidden width, E experts, k top-k,
// B batch, T sequence, K ring slots.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cli.h"
#include "machine.h"
#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "moe/offload/budget.h"
#include "moe/rng.h"
#include "moe/threads.h"
#include "moe/timer.h"

using namespace moe;

namespace {

struct Options {
  std::string arch = "mixtral", dtype = "f32", dir;
  int64_t layers = 8, d_model = 512, d_ff = 1024, experts = 16, top_k = 2, heads = 8;
  int64_t kv_heads = 2, seq = 256, batch = 8, small_batch = 1, small_seq = 32;
  int passes = 3, threads = 0;
  double drop_ms = 250;
  bool quick = false, keep = false;
};

// ---- page cache ---------------------------------------------------------------------------------

int64_t device_read_bytes() {  // bytes this process made the kernel fetch from storage
  std::ifstream in("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (in >> key >> value)
    if (key == "read_bytes:") return value;
  return -1;
}

// Drops `path`'s pages from the page cache; false when the kernel refused.
bool drop_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  ::fsync(fd);
  bool ok = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
  ::close(fd);
  return ok;
}

// Reads the whole file; returns seconds.
double read_file(const std::string& path) {
  Timer t;
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(str("cannot open '", path, "'"));
  std::vector<char> buf(size_t(8) << 20);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
  return t.seconds();
}

// Calls drop_cache every interval while alive.
class Dropper {
 public:
  Dropper(std::string path, double interval_ms) : path_(std::move(path)) {
    if (interval_ms <= 0) return;
    thread_ = std::thread([this, interval_ms] {
      while (!stop_.load()) {
        drop_cache(path_);
        std::this_thread::sleep_for(
            std::chrono::microseconds(static_cast<int64_t>(interval_ms * 1e3)));
      }
    });
  }
  ~Dropper() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::string path_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---- model and batches
// ----------------------------------------------------------------------------

ModelConfig bench_config(const Options& o) {
  ModelConfig c;
  c.arch = parse_arch(o.arch);
  c.layers = o.layers;
  c.d_model = o.d_model;
  c.d_ff = o.d_ff;
  c.experts = o.experts;
  c.top_k = o.top_k;
  c.heads = o.heads;
  c.kv_heads = c.arch == Arch::mixtral ? o.kv_heads : 0;
  c.seq = std::max(o.seq, o.small_seq);
  c.moe_every = 1;
  c.normalize_topk = c.arch == Arch::mixtral;
  c.dtype = parse_dtype(o.dtype);
  c.resolve();
  return c;
}

void save_model(const std::string& path, const ModelConfig& config) {
  ParamSet ps(1234, config.dtype);
  Transformer model(config, ps);
  io::Checkpoint ckpt;
  ckpt.model_config = to_json(config);
  for (const Param* p : std::as_const(ps).all())
    ckpt.params.push_back({p->name, p->value, p->expert, p->shard});
  io::save_checkpoint(path, ckpt);
}

struct Batch {
  Tensor ids, targets;
};

std::vector<Batch> make_batches(const ModelConfig& c, int64_t B, int64_t T, int count) {
  std::vector<Batch> out;
  for (int b = 0; b < count; ++b) {
    std::vector<int32_t> ids(static_cast<size_t>(B * T)), targets(ids.size());
    const uint64_t key = rng_key(99, {static_cast<uint64_t>(b)});
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int32_t>(rng_below(key, 2 * i, static_cast<uint64_t>(c.vocab_size)));
      targets[i] =
          static_cast<int32_t>(rng_below(key, 2 * i + 1, static_cast<uint64_t>(c.vocab_size)));
    }
    out.push_back({Tensor::from_vector({B, T}, ids), Tensor::from_vector({B, T}, targets)});
  }
  return out;
}

// ---- measurement
// ------------------------------------------------------------------------------------

struct Row {
  std::string name;
  double budget_percent = 100;
  int64_t slots = 0;
  double compute_ms = 0, load_ms = 0;  // per MoE layer
  double wait_ms = 0;                  // per pass
  double overlap = 0;                  // %
  int64_t peak_bytes = 0;
  double disk_mb = 0;  // per pass, fetched from the device
  double tokens_per_s = 0;
  double loss = 0;
};

// Times `passes` consecutive evaluate() calls (after one warm-up pass) with the cache dropper on.
// ring: null for the resident model. Hooks time the blocks; a ring row's compute is its block
// time less what compute waited for a layer (the wait happens inside the block, at the experts).
Row measure(const std::string& name, const Transformer& model, offload::ExpertRing* ring,
            const std::vector<Batch>& batches, const std::string& path, const Options& o,
            int64_t moe_layers) {
  Row row;
  row.name = name;
  double block_seconds = 0;
  Timer block;
  BlockHooks timing;
  timing.before = [&](int64_t) { block.reset(); };
  timing.after = [&](int64_t) { block_seconds += block.seconds(); };
  auto pass = [&](int i) {
    const Batch& b = batches[static_cast<size_t>(i) % batches.size()];
    return model.evaluate(b.ids, b.targets, EvalOptions{.hooks = &timing}).loss;
  };
  drop_cache(path);
  row.loss = pass(0);  // warm-up (the ring's first pass also loads its first K layers)
  if (ring) ring->reset_stats();
  block_seconds = 0;
  int64_t tokens = 0;
  double seconds = 0;
  const int64_t disk0 = device_read_bytes();
  {
    Dropper dropper(path, o.drop_ms);
    for (int i = 1; i <= o.passes; ++i) {
      drop_cache(path);
      const Batch& b = batches[static_cast<size_t>(i) % batches.size()];
      Timer t;
      pass(i);
      seconds += t.seconds();
      tokens += b.ids.numel();
    }
  }
  const int64_t disk1 = device_read_bytes();
  row.tokens_per_s = static_cast<double>(tokens) / seconds;
  row.disk_mb = disk0 >= 0 ? static_cast<double>(disk1 - disk0) / 1e6 / o.passes : -1;
  if (ring) {
    ring->drain();
    offload::RingStats s = ring->stats();
    row.slots = s.slots;
    row.budget_percent = 100.0 * static_cast<double>(s.peak_resident_bytes) /
                         static_cast<double>(ring->expert_bytes());
    row.compute_ms = 1e3 * std::max(0.0, block_seconds - s.wait_seconds) /
                     static_cast<double>(o.passes * moe_layers);
    row.load_ms = s.layers_loaded ? 1e3 * s.load_seconds / static_cast<double>(s.layers_loaded) : 0;
    row.wait_ms = 1e3 * s.wait_seconds / o.passes;
    row.overlap = s.overlap_percent;
    row.peak_bytes = s.peak_resident_bytes;
  } else {
    row.slots = moe_layers;
    row.compute_ms = 1e3 * block_seconds / static_cast<double>(o.passes * moe_layers);
    row.overlap = 100;
  }
  return row;
}

int run(const Options& o) {
  // Default: one core is left to the loader thread. With every core computing, the loader's CPU
  // work (checksums, copies) preempts OpenMP threads mid parallel region and the compute of every
  // offload row slows several-fold (measured on a 2-core machine: 8x).
  set_num_threads(o.threads > 0
                      ? o.threads
                      : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1));
  const ModelConfig config = bench_config(o);
  namespace fs = std::filesystem;
  const fs::path dir = o.dir.empty()
                           ? fs::temp_directory_path() / str("moe-offload-bench-", ::getpid())
                           : fs::path(o.dir);
  fs::create_directories(dir);
  const std::string path = (dir / "model.h5").string();
  struct Cleanup {
    fs::path dir;
    bool keep;
    ~Cleanup() {
      std::error_code ec;
      if (!keep) fs::remove_all(dir, ec);
    }
  } cleanup{dir, o.keep || !o.dir.empty()};

  Timer save_timer;
  save_model(path, config);
  const double save_seconds = save_timer.seconds();
  const int64_t file_bytes = static_cast<int64_t>(fs::file_size(path));

  // Does dropping the page cache work here? A cold read after a drop against a warm one.
  const bool dropped = drop_cache(path);
  const int64_t disk0 = device_read_bytes();
  const double cold = read_file(path);
  const int64_t disk1 = device_read_bytes();
  const double warm = read_file(path);
  const int64_t disk2 = device_read_bytes();

  std::printf(
      "# moe-offload-bench: evaluate() tokens/s, experts resident vs streamed through an "
      "ExpertRing of K slots\n");
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  std::printf(
      "# %s, %s, %d threads (+1 loader thread), OMP_WAIT_POLICY=%s, load average %s "
      "at start (other processes on a shared machine disturb every row)\n",
      bench::now_utc().c_str(), bench::cpu_model().c_str(), num_threads(),
      wait_policy ? wait_policy : "(unset)", bench::load_average().c_str());
  {
    infer::LoadedModel m = infer::load_ring_model(path);
    const offload::ExpertRing& probe = *m.ring;
    std::printf(
        "# model: %s %s, L=%ld layers (all MoE), D=%ld, F=%ld, E=%ld, k=%ld, %ld heads; "
        "experts %.1f MB fp32 (%.1f MB per layer), checkpoint %.1f MB, saved in %.1f s\n",
        o.arch.c_str(), o.dtype.c_str(), static_cast<long>(config.layers),
        static_cast<long>(config.d_model), static_cast<long>(config.d_ff),
        static_cast<long>(config.experts), static_cast<long>(config.top_k),
        static_cast<long>(config.heads), probe.expert_bytes() / 1e6, probe.layer_bytes() / 1e6,
        file_bytes / 1e6, save_seconds);
  }
  std::printf(
      "# storage ceiling (the machine, this run): whole-file read after a page-cache drop "
      "%.0f MB/s (device fetched %.1f MB), warm %.0f MB/s (device fetched %.1f MB): "
      "dropping the cache %s\n",
      file_bytes / 1e6 / cold, (disk1 - disk0) / 1e6, file_bytes / 1e6 / warm,
      (disk2 - disk1) / 1e6,
      !dropped ? "FAILED (posix_fadvise refused): reads below are warm"
      : disk1 - disk0 >= file_bytes / 2
          ? "works (the cold read went to the device)"
          : "did NOT reach the device (reads below may be served from memory)");
  std::printf(
      "# page cache dropped before each timed pass and every %.0f ms during the passes "
      "(disk MB = bytes the kernel fetched from the device, /proc/self/io)\n",
      o.drop_ms);
  std::printf(
      "# timing: %d consecutive passes after one warm-up pass, same batches for every "
      "row; compute and load are per MoE layer (loader: read + checksum + convert), wait "
      "per pass; overlap = 100 (1 - wait / load)\n",
      o.passes);

  struct Regime {
    std::string title;
    int64_t batch, seq;
  };
  std::vector<Regime> regimes = {
      {"compute >= load per layer (the ring should hide the loads)", o.batch, o.seq},
      {"load-bound: small batch, load >> compute per layer (storage bandwidth decides; nothing "
       "can hide it)",
       o.small_batch, o.small_seq}};
  for (const Regime& regime : regimes) {
    const std::vector<Batch> batches = make_batches(config, regime.batch, regime.seq, 2);
    std::printf("#\n# regime: %s; B=%ld T=%ld (%ld tokens per pass)\n", regime.title.c_str(),
                static_cast<long>(regime.batch), static_cast<long>(regime.seq),
                static_cast<long>(regime.batch * regime.seq));
    std::printf("# %-18s %7s %3s %9s %9s %9s %8s %9s %9s %10s %8s\n", "config", "budget", "K",
                "compute", "load", "wait", "overlap", "resident", "disk", "tokens/s", "vs");
    std::printf("# %-18s %7s %3s %9s %9s %9s %8s %9s %9s %10s %8s\n", "", "(%)", "", "(ms/layer)",
                "(ms/layer)", "(ms/pass)", "(%)", "(MB)", "(MB/pass)", "", "resident");
    std::fflush(stdout);
    double resident_tps = 0, resident_loss = 0;
    auto print = [&](const Row& r) {
      std::printf("  %-18s %7.0f %3ld %9.1f %9.1f %9.1f %8.1f %9.1f %9.1f %10.1f %8.2f%s\n",
                  r.name.c_str(), r.budget_percent, static_cast<long>(r.slots), r.compute_ms,
                  r.load_ms, r.wait_ms, r.overlap, r.peak_bytes / 1e6, r.disk_mb, r.tokens_per_s,
                  resident_tps > 0 ? r.tokens_per_s / resident_tps : 1.0,
                  r.loss == resident_loss ? "" : "  LOSS DIFFERS");
      std::fflush(stdout);
    };
    {
      infer::LoadedModel m = infer::load_model(path);
      Row r = measure("resident", *m.model, nullptr, batches, path, o, config.num_moe_layers());
      int64_t expert_bytes = 0;
      for (const Param* p : std::as_const(*m.params).all())
        if (p->expert) expert_bytes += p->value.numel() * 4;
      r.peak_bytes = expert_bytes;
      resident_tps = r.tokens_per_s;
      resident_loss = r.loss;
      print(r);
    }
    struct Variant {
      const char* name;
      const char* budget;
      bool overlap;
    };
    for (const Variant& v : {Variant{"ring 50%", "50%", true}, Variant{"ring 25%", "25%", true},
                             Variant{"on-demand 25%", "25%", false}}) {
      infer::LoadedModel m = infer::load_ring_model(path);
      offload::RingConfig rc;
      rc.budget_bytes = offload::parse_bytes("--expert-budget", v.budget, m.ring->expert_bytes());
      rc.overlap = v.overlap;
      m.ring->start(rc);
      print(measure(v.name, *m.model, m.ring.get(), batches, path, o, config.num_moe_layers()));
    }
  }
  std::printf("# load average %s at the end\n", bench::load_average().c_str());
  return tools::finish_stdout("moe-offload-bench");
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "moe-offload-bench: evaluate() throughput with the experts resident against expert offload "
      "through an ExpertRing (50%, 25% budgets; naive on-demand at 25%), reading a real "
      "checkpoint with the page cache dropped"};
  app.add_option("--arch", opt.arch, "gpt or mixtral")->capture_default_str();
  app.add_option("--dtype", opt.dtype, "Checkpoint dtype (f32, bf16, f16)")->capture_default_str();
  app.add_option("--layers", opt.layers, "Layers (all MoE)")->capture_default_str();
  app.add_option("--d-model", opt.d_model, "Model width D")->capture_default_str();
  app.add_option("--d-ff", opt.d_ff, "Expert hidden width F")->capture_default_str();
  app.add_option("--experts", opt.experts, "Experts per layer E")->capture_default_str();
  app.add_option("--top-k", opt.top_k, "Experts per token k")->capture_default_str();
  app.add_option("--heads", opt.heads, "Attention heads")->capture_default_str();
  app.add_option("--kv-heads", opt.kv_heads, "KV heads (mixtral)")->capture_default_str();
  app.add_option("--batch", opt.batch, "Batch B of the compute regime")->capture_default_str();
  app.add_option("--seq", opt.seq, "Sequence T of the compute regime")->capture_default_str();
  app.add_option("--small-batch", opt.small_batch, "Batch of the load-bound regime")
      ->capture_default_str();
  app.add_option("--small-seq", opt.small_seq, "Sequence of the load-bound regime")
      ->capture_default_str();
  app.add_option("--passes", opt.passes, "Timed passes per row")->capture_default_str();
  app.add_option("--drop-ms", opt.drop_ms,
                 "Interval of the page-cache dropper during passes (0 = only before each pass)")
      ->capture_default_str();
  app.add_option("--threads", opt.threads,
                 "Compute threads (0 = cores - 1: one core for the loader)");
  app.add_option("--dir", opt.dir,
                 "Where to write the checkpoint (default: a temporary "
                 "directory, removed at the end; a given one is kept)");
  app.add_flag("--keep", opt.keep, "Keep the temporary checkpoint");
  app.add_flag("--quick", opt.quick, "Small model and batches (smoke run)");
  return tools::run_tool("moe-offload-bench", app, argc, argv, [&]() -> int {
    if (opt.quick) {
      opt.layers = 4;
      opt.d_model = 128;
      opt.d_ff = 256;
      opt.experts = 8;
      opt.heads = 4;
      opt.batch = 2;
      opt.seq = 64;
      opt.small_seq = 16;
      opt.passes = 2;
    }
    return run(opt);
  });
}
