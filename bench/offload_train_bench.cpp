// moe-offload-train-bench: offloaded training (the tiered ExpertStore, issue 16) against resident
// training with train::Trainer on the CPU backend, on a real corpus. Three tables:
//   1. memory: E experts per layer (fixed F, so the experts' state grows with E) x resident / host
//      / ssd: each run's peak RSS against a bound (its terms printed) and a fixed RAM budget;
//   2. throughput: offloaded / resident tokens/s in a compute-bound regime (many tokens per
//      expert) and a load-bound one (few), runs alternated resident, host, ssd, ssd-cold (the ssd
//      tier with its files dropped from the page cache every --drop-ms: the storage's speed),
//      median ratios;
//   3. ablation in ES-MoE's order (full system, then pinning, optimizer overlap, prefetch off,
//      and the clipped default), each with the store's statistics (--ab-tier host | ssd |
//      ssd-cold). --tables picks which run.
// Every run happens in a forked child, so its peak RSS (ru_maxrss from wait4) is its own and no
// run's heap or page faults disturb the next; the parent builds no model. Every offloaded row
// carries a correctness column: a checksum of its final parameters (every tensor's storage
// bytes, the offloaded experts read back one at a time) equals the resident run's with the same
// flags. Not a test: no speed is asserted. Shapes: L layers (all MoE), D model width, F expert
// hidden width, E experts per layer, k top-k, B batch, T sequence.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cli.h"
#include "machine.h"
#include "moe/offload/budget.h"
#include "moe/threads.h"
#include "moe/timer.h"
#include "moe/train/trainer.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

constexpr double MiB = 1024.0 * 1024.0;

struct Options {
  std::string data = "/usr/share/games/fortunes/linux", arch = "mixtral", dir;
  std::string ab_tier = "host", only = "1,2,3", ram_budget = "256MiB", host_budget = "64MiB",
              sweep = "8,16,32,64,128";
  int64_t layers = 2, d_model = 128, d_ff = 256, batch = 8, seq = 128, mem_slots = 8;
  int64_t tp_d_model = 256, tp_d_ff = 512, tp_experts = 8, tp_batch = 16, tp_seq = 128;
  int64_t small_batch = 1, small_seq = 16, ab_experts = 16, ab_slots = 6;
  int64_t steps = 3, warmup = 1, rounds = 3;
  double overhead_mib = 16, drop_ms = 50;
  int threads = 0;
  bool quick = false;
};

// ---- one training run in a child process ---------------------------------------------------

struct Spec {
  ModelConfig model;
  train::TrainConfig train;
  int64_t warmup = 1, steps = 3;
  int threads = 1;
  double drop_ms = 0;  // ssd: drop the expert files from the page cache this often (0: never)
};

// What a child sends back (trivially copyable: written whole through a pipe).
struct Result {
  char error[400] = {};
  double tokens_per_s = 0, step_seconds = 0, loss = 0;
  uint64_t checksum = 0;
  int64_t start_rss = 0;        // the child's RSS before it builds anything (the program)
  int64_t activation_peak = 0;  // StepStats::activation_peak_bytes, max over the steps
  int64_t dense_state = 0;      // bytes of the non-expert parameters' state (value, grad, AdamW)
  int64_t expert_state = 0;     // bytes of the experts' state wherever it lives
  int64_t device_slots = 0, slot_bytes = 0, host_bytes = 0, uploads = 0, upload_hits = 0;
  int64_t overlapped = 0, after = 0, cache_hits = 0, cache_misses = 0, write_backs = 0;
  int64_t ssd_read = 0, ssd_written = 0, disk_read = 0, disk_written = 0;
  double wait_seconds = 0, finish_seconds = 0;
  double io_seconds = 0;  // the SSD files' reads and writes, summed over the store's threads
  int64_t peak_rss = 0;   // filled by the parent: ru_maxrss of the child
  bool ok() const { return error[0] == 0; }
};

int64_t status_bytes(const char* key) {  // a "VmRSS:"-style line of /proc/self/status, in bytes
  std::ifstream in("/proc/self/status");
  std::string k;
  int64_t kb = 0;
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      std::istringstream(line.substr(std::strlen(key))) >> kb;
      return kb * 1024;
    }
  return -1;
}

void proc_io(int64_t& read, int64_t& written) {  // bytes this process had the kernel move
  std::ifstream in("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) {
    if (key == "read_bytes:") read = value;
    if (key == "write_bytes:") written = value;
  }
}

uint64_t fnv(uint64_t h, const void* data, size_t n) {  // FNV-1a, 64 bits
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Every parameter's storage bytes in creation order; an offloaded expert tensor one expert at a
// time (the same bytes, in the same order, as the resident [E, ...] tensor).
uint64_t parameter_checksum(train::Trainer& t) {
  uint64_t h = 1469598103934665603ull;
  const offload::TieredStore* store = t.expert_store();
  for (const Param* p : std::as_const(t.params()).all()) {
    if (!p->offloaded) {
      h = fnv(h, p->value.raw(), static_cast<size_t>(p->value.nbytes()));
      continue;
    }
    for (int64_t e = 0; e < p->shape[0]; ++e) {
      const Tensor slice = store->read(*p, e, "value");
      h = fnv(h, slice.raw(), static_cast<size_t>(slice.nbytes()));
    }
  }
  return h;
}

// Every `interval_ms` while alive: fsync + posix_fadvise(POSIX_FADV_DONTNEED) on every file
// under `dir`, so the ssd tier's reads go to the device and its writes reach it (storage speed).
class CacheDropper {
 public:
  CacheDropper(std::string dir, double interval_ms) : dir_(std::move(dir)) {
    if (interval_ms <= 0 || dir_.empty()) return;
    thread_ = std::thread([this, interval_ms] {
      while (!stop_.load()) {
        std::error_code ec;
        for (auto it = fs::recursive_directory_iterator(dir_, ec);
             !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
          if (!it->is_regular_file(ec)) continue;
          const int fd = ::open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
          if (fd < 0) continue;
          ::fdatasync(fd);
          (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
          ::close(fd);
        }
        std::this_thread::sleep_for(
            std::chrono::microseconds(static_cast<int64_t>(interval_ms * 1e3)));
      }
    });
  }
  ~CacheDropper() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::string dir_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

Result train_here(const Spec& s) {
  Result r;
  r.start_rss = status_bytes("VmRSS:");
  set_num_threads(s.threads);
  train::Trainer t(s.model, s.train, {});
  const int64_t storage = dtype_size(s.model.dtype);
  // Resident state per element: value, fp32 grad, AdamW m and v, and the fp32 compute copy of a
  // non-f32 value (optim::AdamW keeps no separate master: the compute copy is it).
  const int64_t per = storage + 12 + (s.model.dtype == DType::f32 ? 0 : 4);
  for (const Param* p : std::as_const(t.params()).all()) {
    if (p->offloaded) continue;
    (p->expert ? r.expert_state : r.dense_state) += p->numel() * per;
  }
  CacheDropper dropper(s.train.offload.ssd_dir, s.drop_ms);
  for (int64_t i = 0; i < s.warmup; ++i) t.step();
  int64_t r0 = 0, w0 = 0, r1 = 0, w1 = 0;
  proc_io(r0, w0);
  offload::StoreStats before;
  if (t.expert_store()) before = t.expert_store()->stats();
  int64_t tokens = 0;
  Timer timer;
  for (int64_t i = 0; i < s.steps; ++i) {
    const train::StepStats st = t.step();
    tokens += st.tokens;
    r.loss = st.forward.total;
    r.activation_peak = std::max(r.activation_peak, st.activation_peak_bytes);
  }
  const double seconds = timer.seconds();
  proc_io(r1, w1);
  r.tokens_per_s = static_cast<double>(tokens) / seconds;
  r.step_seconds = seconds / static_cast<double>(s.steps);
  r.disk_read = r1 - r0;
  r.disk_written = w1 - w0;
  if (const offload::TieredStore* store = t.expert_store()) {
    // Counters over the timed steps only; sizes as they are.
    const offload::StoreStats a = store->stats();
    r.expert_state = a.record_bytes;
    r.device_slots = a.device_slots;
    r.slot_bytes = a.slot_bytes;
    r.host_bytes = a.host_bytes;
    r.uploads = a.uploads - before.uploads;
    r.upload_hits = a.upload_hits - before.upload_hits;
    r.overlapped = a.optimizer_overlapped - before.optimizer_overlapped;
    r.after = a.optimizer_after - before.optimizer_after;
    r.wait_seconds = a.wait_seconds - before.wait_seconds;
    r.finish_seconds = a.finish_seconds - before.finish_seconds;
    r.cache_hits = a.cache.hits - before.cache.hits;
    r.cache_misses = a.cache.misses - before.cache.misses;
    r.write_backs = a.cache.write_backs - before.cache.write_backs;
    r.ssd_read = a.ssd_bytes_read - before.ssd_bytes_read;
    r.ssd_written = a.ssd_bytes_written - before.ssd_bytes_written;
    r.io_seconds = (a.ssd_read_seconds + a.ssd_write_seconds) -
                   (before.ssd_read_seconds + before.ssd_write_seconds);
  }
  r.checksum = parameter_checksum(t);
  return r;
}

// Runs `s` in a forked child; the parent waits and adds the child's peak RSS.
Result train_in_child(const Spec& s) {
  std::fflush(stdout);
  std::fflush(stderr);
  int fds[2];
  if (::pipe(fds) != 0) throw Error("pipe() failed");
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("fork() failed");
  if (pid == 0) {
    ::close(fds[0]);
    Result r;
    try {
      r = train_here(s);
    } catch (const std::exception& e) {
      std::snprintf(r.error, sizeof r.error, "%s", e.what());
    }
    const char* p = reinterpret_cast<const char*>(&r);
    size_t left = sizeof r;
    while (left > 0) {
      const ssize_t n = ::write(fds[1], p, left);
      if (n <= 0) break;
      p += n;
      left -= static_cast<size_t>(n);
    }
    ::_exit(0);  // no destructors of the parent's objects, no atexit handlers twice
  }
  ::close(fds[1]);
  Result r;
  char* p = reinterpret_cast<char*>(&r);
  size_t got = 0;
  while (got < sizeof r) {
    const ssize_t n = ::read(fds[0], p + got, sizeof r - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fds[0]);
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  if (got != sizeof r)
    std::snprintf(r.error, sizeof r.error, "child died (status %d) before reporting", status);
  r.peak_rss = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  return r;
}

// ---- configurations ---------------------------------------------------------------------------

ModelConfig model(const Options& o, int64_t d_model, int64_t d_ff, int64_t experts, int64_t seq) {
  ModelConfig m;
  m.arch = parse_arch(o.arch);
  m.layers = o.layers;
  m.d_model = d_model;
  m.heads = 4;
  m.kv_heads = m.arch == Arch::mixtral ? 2 : 0;
  m.d_ff = d_ff;
  m.seq = seq;
  m.experts = experts;
  m.moe_every = 1;
  m.top_k = 2;
  m.normalize_topk = m.arch == Arch::mixtral;
  m.resolve();
  return m;
}

// One expert's fp32 weights, the size of a device slot (with slack for section alignment).
int64_t slot_bytes(const ModelConfig& m) {
  const int64_t D = m.d_model, F = m.d_ff;
  return (m.arch == Arch::gpt ? 2 * F * D + F + D : 3 * F * D) * 4 + 4096;
}

Spec spec(const Options& o, const ModelConfig& m, int64_t batch, const std::string& mode,
          const std::string& ssd_dir) {
  Spec s;
  s.model = m;
  s.warmup = o.warmup;
  s.steps = o.steps;
  s.threads = o.threads;
  s.train.data = o.data;
  s.train.batch = batch;
  s.train.steps = o.warmup + o.steps;
  s.train.warmup = 1;
  s.train.eval_batches = 1;
  s.train.clip = 0;  // the optimizer overlaps backward (the full system)
  s.train.offload.tier = offload::parse_tier(mode);
  if (mode == "ssd") s.train.offload.ssd_dir = ssd_dir;
  return s;
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", bytes / MiB);
  return buf;
}

// The scratch directory of one ssd run: made before it, removed after it.
struct Scratch {
  fs::path root;
  int next = 0;
  std::string make() {
    const fs::path p = root / str("run-", next++);
    fs::create_directories(p);
    return p.string();
  }
  static void drop(const std::string& p) {
    std::error_code ec;
    if (!p.empty()) fs::remove_all(p, ec);
  }
};

Result run(const Spec& s, Scratch& scratch) {
  Spec c = s;
  if (c.train.offload.tier == offload::Tier::ssd) c.train.offload.ssd_dir = scratch.make();
  const Result r = train_in_child(c);
  Scratch::drop(c.train.offload.ssd_dir);
  return r;
}

void fail(const Result& r, const std::string& what) {
  if (!r.ok()) throw Error(str(what, ": ", r.error));
}

const char* same(const Result& r, const Result& ref) {
  return r.checksum == ref.checksum && r.loss == ref.loss ? "yes" : "NO";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---- ceilings ------------------------------------------------------------------------------

// Single-thread memcpy bandwidth (GB/s) over `bytes`: what a host-tier upload (an f32 record's
// weights into a slot) can reach.
double memcpy_ceiling(int64_t bytes) {
  std::vector<char> a(static_cast<size_t>(bytes), 1), b(static_cast<size_t>(bytes), 0);
  std::memcpy(b.data(), a.data(), a.size());
  Timer t;
  const int reps = 8;
  for (int i = 0; i < reps; ++i) std::memcpy(b.data(), a.data() + (i & 1), a.size() - 1);
  return static_cast<double>(bytes) * reps / t.seconds() / 1e9;
}

// Sequential write + fsync and read after a page-cache drop of `bytes` in `dir` (MB/s each).
void file_ceiling(const std::string& dir, int64_t bytes, double& write_mbs, double& read_mbs) {
  const std::string path = (fs::path(dir) / "ceiling.bin").string();
  std::vector<char> buf(size_t{4} << 20, 7);
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) throw Error(str("cannot create '", path, "' (--ssd-dir)"));
  Timer tw;
  for (int64_t done = 0; done < bytes; done += static_cast<int64_t>(buf.size()))
    if (::write(fd, buf.data(), buf.size()) < 0) break;
  ::fsync(fd);
  write_mbs = static_cast<double>(bytes) / tw.seconds() / 1e6;
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  fd = ::open(path.c_str(), O_RDONLY);
  Timer tr;
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  read_mbs = static_cast<double>(bytes) / tr.seconds() / 1e6;
  ::close(fd);
  fs::remove(path);
}

// ---- 1. memory --------------------------------------------------------------------------------

void memory_table(const Options& o, Scratch& scratch, int64_t ram_budget, int64_t host_budget) {
  std::printf(
      "#\n# 1. memory: peak RSS of each run alone (a forked child's ru_maxrss) against its bound "
      "and the RAM budget %s MiB; L=%ld D=%ld F=%ld k=2 B=%ld T=%ld, f32; host and ssd with a "
      "device budget of %ld slots (CPU: the slots are RAM too), ssd with --host-budget %s MiB\n",
      mib(double(ram_budget)).c_str(), long(o.layers), long(o.d_model), long(o.d_ff), long(o.batch),
      long(o.seq), long(o.mem_slots), mib(double(host_budget)).c_str());
  std::printf(
      "# bound = program (the child's RSS before it builds anything) + experts' state held in "
      "RAM (resident: all of it in the ParamSet; host: every record; ssd: --host-budget) + "
      "slots + non-expert state (value, grad, AdamW m, v: from the model's parameters) + "
      "activations (measured: the arena's high-water mark, StepStats) + overhead %.0f MiB "
      "(stated: allocator, thread stacks, I/O buffers, the corpus); over = peak - (bound - "
      "overhead): the overhead measured\n",
      o.overhead_mib);
  std::printf("# %4s %-8s %7s %7s %6s %6s %6s %6s %7s %7s %6s %6s %6s %9s %7s\n", "E", "mode",
              "state", "inRAM", "slots", "dense", "act", "prog", "bound", "peak", "over", "<=bnd",
              "<=RAM", "tokens/s", "params");
  std::printf("# %4s %-8s %7s %7s %6s %6s %6s %6s %7s %7s %6s %6s %6s %9s %7s\n", "", "", "(MiB)",
              "(MiB)", "(MiB)", "(MiB)", "(MiB)", "(MiB)", "(MiB)", "(MiB)", "(MiB)", "", "", "",
              "=resid");
  std::vector<int64_t> sweep;
  {
    std::stringstream ss(o.sweep);
    std::string item;
    while (std::getline(ss, item, ',')) sweep.push_back(std::stoll(item));
  }
  int64_t largest[3] = {0, 0, 0};
  const char* modes[3] = {"resident", "host", "ssd"};
  for (int64_t E : sweep) {
    const ModelConfig m = model(o, o.d_model, o.d_ff, E, o.seq);
    Result ref;
    for (int mi = 0; mi < 3; ++mi) {
      Spec s = spec(o, m, o.batch, mi == 0 ? "none" : modes[mi], "");
      if (mi > 0) s.train.offload.device_budget = str(o.mem_slots * slot_bytes(m));
      if (mi == 2) s.train.offload.host_budget = str(host_budget);
      const Result r = run(s, scratch);
      fail(r, str("E=", E, " ", modes[mi]));
      if (mi == 0) ref = r;
      const double in_ram = mi == 0   ? double(r.expert_state)
                            : mi == 1 ? double(r.host_bytes)
                                      : double(std::min(host_budget, r.expert_state));
      const double slots = double(r.device_slots * r.slot_bytes);
      const double bound = double(r.start_rss) + in_ram + slots + double(r.dense_state) +
                           double(r.activation_peak) + o.overhead_mib * MiB;
      const bool fits = r.peak_rss <= ram_budget;
      if (fits) largest[mi] = std::max(largest[mi], E);
      std::printf("  %4ld %-8s %7s %7s %6s %6s %6s %6s %7s %7s %6s %6s %6s %9.0f %7s\n", long(E),
                  modes[mi], mib(double(r.expert_state)).c_str(), mib(in_ram).c_str(),
                  mib(slots).c_str(), mib(double(r.dense_state)).c_str(),
                  mib(double(r.activation_peak)).c_str(), mib(double(r.start_rss)).c_str(),
                  mib(bound).c_str(), mib(double(r.peak_rss)).c_str(),
                  mib(double(r.peak_rss) - bound + o.overhead_mib * MiB).c_str(),
                  double(r.peak_rss) <= bound ? "yes" : "NO", fits ? "yes" : "no", r.tokens_per_s,
                  mi == 0 ? "-" : same(r, ref));
      if (mi == 2 && r.expert_state < 4 * host_budget)
        std::printf("# %4s (ssd: the experts' state is %.1fx --host-budget, under 4x)\n", "",
                    double(r.expert_state) / double(host_budget));
    }
  }
  std::printf(
      "# largest E trained within the RAM budget %s MiB: resident %ld, host %ld, ssd %ld "
      "(0: none of the sweep)\n",
      mib(double(ram_budget)).c_str(), long(largest[0]), long(largest[1]), long(largest[2]));
}

// ---- 2. throughput ----------------------------------------------------------------------------

void throughput_table(const Options& o, Scratch& scratch) {
  std::printf(
      "#\n# 2. throughput: offloaded / resident tokens/s, runs alternated resident, host, ssd "
      "%ld times (each a fresh child: %ld warm-up + %ld timed steps, --clip 0, pin 0.25, "
      "prefetch 2, default budgets: slots = pinned + prefetch + 1, ssd cache = a quarter of the "
      "state); ratio per round, median over rounds; L=%ld D=%ld F=%ld E=%ld k=2, f32\n",
      long(o.rounds), long(o.warmup), long(o.steps), long(o.layers), long(o.tp_d_model),
      long(o.tp_d_ff), long(o.tp_experts));
  struct Regime {
    const char* name;
    int64_t batch, seq;
  };
  const Regime regimes[2] = {{"compute", o.tp_batch, o.tp_seq},
                             {"load", o.small_batch, o.small_seq}};
  // ssd-cold: the ssd tier with its files dropped from the page cache every --drop-ms (reads
  // from the device, writes forced to it): the storage's speed, not the page cache's.
  const char* modes[4] = {"resident", "host", "ssd", "ssd-cold"};
  for (const Regime& g : regimes) {
    const ModelConfig m = model(o, o.tp_d_model, o.tp_d_ff, o.tp_experts, g.seq);
    const double per_expert = double(g.batch * g.seq * m.top_k) / double(m.experts);
    std::printf(
        "# regime %s-bound: B=%ld T=%ld, %.1f tokens per expert per step (mean), one expert's "
        "fp32 weights %.2f MiB (a slot's upload), its state %.2f MiB (an ssd record)\n",
        g.name, long(g.batch), long(g.seq), per_expert, double(slot_bytes(m) - 4096) / MiB,
        double(slot_bytes(m) - 4096) * 4 / MiB);
    std::printf("# %-7s %5s %-8s %9s %8s %8s %8s %8s %8s %9s %9s %8s %9s %7s\n", "regime", "round",
                "mode", "tokens/s", "step", "vs", "wait", "finish", "uploads", "ssd r+w", "ssd",
                "ssd io", "device", "params");
    std::printf("# %-7s %5s %-8s %9s %8s %8s %8s %8s %8s %9s %9s %8s %9s %7s\n", "", "", "", "",
                "(s)", "resident", "(s/step)", "(s/step)", "(/step)", "(MB/step)", "(MB/s)",
                "(s/step)", "(MB/step)", "=resid");
    std::vector<double> ratio[4];
    for (int64_t round = 1; round <= o.rounds; ++round) {
      Result ref;
      for (int mi = 0; mi < 4; ++mi) {
        Spec sp = spec(o, m, g.batch, mi == 0 ? "none" : mi == 1 ? "host" : "ssd", "");
        if (mi == 3) sp.drop_ms = o.drop_ms;
        const Result r = run(sp, scratch);
        fail(r, str(g.name, " regime, ", modes[mi]));
        if (mi == 0) ref = r;
        ratio[mi].push_back(r.tokens_per_s / ref.tokens_per_s);
        const double steps = double(o.steps);
        const double io = double(r.ssd_read + r.ssd_written) / 1e6 / steps;
        std::printf(
            "  %-7s %5ld %-8s %9.0f %8.3f %8.3f %8.3f %8.3f %8.1f %9.1f %9.0f %8.3f %9.1f %7s\n",
            g.name, long(round), modes[mi], r.tokens_per_s, r.step_seconds,
            r.tokens_per_s / ref.tokens_per_s, r.wait_seconds / steps, r.finish_seconds / steps,
            double(r.uploads) / steps, io, mi >= 2 ? io / r.step_seconds : 0.0,
            r.io_seconds / steps, double(r.disk_read + r.disk_written) / 1e6 / steps,
            mi == 0 ? "-" : same(r, ref));
      }
    }
    const bool compute = g.name[0] == 'c';
    auto verdict = [&](double ratio_, double target) {
      return !compute ? std::string(" (load-bound: no target)")
                      : str(" (target ", target, ": ", ratio_ >= target ? "met" : "NOT met", ")");
    };
    std::printf(
        "# %s-bound median ratio over %ld rounds: host/resident %.3f%s, ssd/resident %.3f%s, "
        "ssd-cold/resident %.3f%s\n",
        g.name, long(o.rounds), median(ratio[1]), verdict(median(ratio[1]), 0.9).c_str(),
        median(ratio[2]), verdict(median(ratio[2]), 0.8).c_str(), median(ratio[3]),
        verdict(median(ratio[3]), 0.8).c_str());
  }
}

// ---- 3. ablation ------------------------------------------------------------------------------

void ablation_table(const Options& o, Scratch& scratch) {
  const ModelConfig m = model(o, o.tp_d_model, o.tp_d_ff, o.ab_experts, o.tp_seq);
  std::printf(
      "#\n# 3. ablation in ES-MoE's order, %s tier%s, device budget %ld slots of %ld experts: "
      "L=%ld D=%ld F=%ld E=%ld k=2 B=%ld T=%ld, f32; median tokens/s over %ld rounds (rows "
      "alternated within a round); store counters per timed step\n",
      o.ab_tier == "host" ? "host" : "ssd",
      o.ab_tier == "host"  ? ""
      : o.ab_tier == "ssd" ? " (cache: a quarter of the state)"
                           : " (cache: a quarter of the state; files dropped from the page cache "
                             "every --drop-ms)",
      long(o.ab_slots), long(o.layers * o.ab_experts), long(o.layers), long(o.tp_d_model),
      long(o.tp_d_ff), long(o.ab_experts), long(o.tp_batch), long(o.tp_seq), long(o.rounds));
  struct Row {
    const char* name;
    std::function<void(train::TrainConfig&)> apply;
    bool resident = false;
    int reference = 0;  // the row whose checksum this one must match
  };
  const std::vector<Row> rows = {
      {"resident --clip 0", [](train::TrainConfig&) {}, true, 0},
      {"resident --clip 1", [](train::TrainConfig& t) { t.clip = 1; }, true, 1},
      {"full system", [](train::TrainConfig&) {}, false, 0},
      {"- pinning", [](train::TrainConfig& t) { t.offload.pin_fraction = 0; }, false, 0},
      {"- opt overlap", [](train::TrainConfig& t) { t.offload.optimizer_overlap = false; }, false,
       0},
      {"- prefetch", [](train::TrainConfig& t) { t.offload.prefetch_depth = 0; }, false, 0},
      {"full, --clip 1", [](train::TrainConfig& t) { t.clip = 1; }, false, 1},
  };
  std::vector<std::vector<Result>> results(rows.size());
  for (int64_t round = 0; round < o.rounds; ++round)
    for (size_t i = 0; i < rows.size(); ++i) {
      Spec s = spec(o, m, o.tp_batch,
                    rows[i].resident      ? "none"
                    : o.ab_tier == "host" ? "host"
                                          : "ssd",
                    "");
      if (!rows[i].resident) s.train.offload.device_budget = str(o.ab_slots * slot_bytes(m));
      if (!rows[i].resident && o.ab_tier == "ssd-cold") s.drop_ms = o.drop_ms;
      rows[i].apply(s.train);
      results[i].push_back(run(s, scratch));
      fail(results[i].back(), rows[i].name);
    }
  std::vector<double> tps(rows.size()), lo(rows.size()), hi(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<double> v;
    for (const Result& r : results[i]) v.push_back(r.tokens_per_s);
    tps[i] = median(v);
    lo[i] = *std::min_element(v.begin(), v.end());
    hi[i] = *std::max_element(v.begin(), v.end());
  }
  std::printf("# %-18s %9s %13s %7s %8s %8s %8s %8s %8s %8s %7s\n", "config", "tokens/s",
              "tokens/s", "vs", "uploads", "hits", "overlap", "after", "wait", "finish", "params");
  std::printf("# %-18s %9s %13s %7s %8s %8s %8s %8s %8s %8s %7s\n", "", "(median)", "(min-max)",
              "full", "(/step)", "(/step)", "(/step)", "(/step)", "(s/step)", "(s/step)", "=resid");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Result& r = results[i].back();  // counters: the last round's run
    const double steps = double(o.steps);
    bool all_same = true;
    for (size_t k = 0; k < results[i].size(); ++k)
      all_same = all_same &&
                 std::string(same(results[i][k], results[size_t(rows[i].reference)][k])) == "yes";
    std::printf("  %-18s %9.0f %13s %7.3f %8.1f %8.1f %8.1f %8.1f %8.3f %8.3f %7s\n", rows[i].name,
                tps[i], str(int64_t(lo[i]), "-", int64_t(hi[i])).c_str(), tps[i] / tps[2],
                double(r.uploads) / steps, double(r.upload_hits) / steps,
                double(r.overlapped) / steps, double(r.after) / steps, r.wait_seconds / steps,
                r.finish_seconds / steps, rows[i].resident ? "-" : (all_same ? "yes" : "NO"));
  }
}

int run_all(const Options& o) {
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
  Options opt = o;
  opt.threads = threads;
  MOE_USAGE_CHECK(fs::exists(o.data), "--data '", o.data,
                  "' does not exist (the fortunes package installs the default corpus)");
  const int64_t ram_budget = offload::parse_bytes("--ram-budget", o.ram_budget, 0);
  const int64_t host_budget = offload::parse_bytes("--host-budget", o.host_budget, 0);
  const fs::path root = o.dir.empty() ? fs::temp_directory_path() : fs::path(o.dir);
  MOE_USAGE_CHECK(fs::is_directory(root), "--ssd-dir '", root.string(), "' is not a directory");
  Scratch scratch{root / str("moe-offload-train-bench-", ::getpid())};
  fs::create_directories(scratch.root);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{scratch.root};

  double write_mbs = 0, read_mbs = 0;
  file_ceiling(scratch.root.string(), int64_t{64} << 20, write_mbs, read_mbs);
  const double copy_gbs = memcpy_ceiling(int64_t{64} << 20);
  std::printf(
      "# moe-offload-train-bench: train::Trainer on the CPU, experts resident vs the tiered "
      "ExpertStore (--offload host | ssd)\n");
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  std::printf(
      "# %s, %s, %u cores, %d compute threads per run (the store's loader and optimizer threads "
      "besides), OMP_WAIT_POLICY=%s, load average %s at start (other processes on a shared "
      "machine disturb every row)\n",
      bench::now_utc().c_str(), bench::cpu_model().c_str(), std::thread::hardware_concurrency(),
      threads, wait_policy ? wait_policy : "(unset)", bench::load_average().c_str());
  std::printf(
      "# data %s; ceilings (this run): memcpy %.1f GB/s (one thread: a host-tier upload), "
      "scratch dir %s: sequential write+fsync %.0f MB/s, read after a page-cache drop %.0f "
      "MB/s (the ssd tier's files also live in the page cache: its reads are usually memory)\n",
      o.data.c_str(), copy_gbs, scratch.root.string().c_str(), write_mbs, read_mbs);
  std::printf(
      "# params =resid: the run's final parameters (every tensor's bytes, FNV-1a) and last "
      "loss equal the resident run's with the same flags\n");
  std::fflush(stdout);
  if (o.only.find('1') != std::string::npos) memory_table(opt, scratch, ram_budget, host_budget);
  std::fflush(stdout);
  if (o.only.find('2') != std::string::npos) throughput_table(opt, scratch);
  std::fflush(stdout);
  if (o.only.find('3') != std::string::npos) ablation_table(opt, scratch);
  std::printf("# load average %s at the end\n", bench::load_average().c_str());
  return tools::finish_stdout("moe-offload-train-bench");
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "moe-offload-train-bench: offloaded training (--offload host | ssd) against resident "
      "training on the CPU: peak RSS against a RAM budget as the experts grow, throughput "
      "ratios, and an ablation of pinning, optimizer overlap and prefetch"};
  app.add_option("--data", opt.data, "Training corpus")->capture_default_str();
  app.add_option("--tables", opt.only, "Which tables to run (1 memory, 2 throughput, 3 ablation)")
      ->capture_default_str()
      ->check([](const std::string& v) {
        return !v.empty() && v.find_first_not_of("123,") == std::string::npos
                   ? std::string()
                   : std::string("a comma-separated list of 1, 2, 3");
      });
  app.add_option("--arch", opt.arch, "gpt or mixtral")->capture_default_str();
  app.add_option("--ram-budget", opt.ram_budget, "Table 1: the RAM budget (bytes, e.g. 256MiB)")
      ->capture_default_str();
  app.add_option("--host-budget", opt.host_budget, "Table 1: the ssd tier's host cache")
      ->capture_default_str();
  app.add_option("--sweep", opt.sweep, "Table 1: experts per layer, comma-separated")
      ->capture_default_str();
  app.add_option("--layers", opt.layers, "Layers (all MoE)")->capture_default_str();
  app.add_option("--d-model", opt.d_model, "Table 1: model width D")->capture_default_str();
  app.add_option("--d-ff", opt.d_ff, "Table 1: expert hidden width F")->capture_default_str();
  app.add_option("--batch", opt.batch, "Table 1: batch")->capture_default_str();
  app.add_option("--seq", opt.seq, "Table 1: sequence length")->capture_default_str();
  app.add_option("--mem-slots", opt.mem_slots, "Table 1: device slots of host and ssd runs")
      ->capture_default_str();
  app.add_option("--tp-d-model", opt.tp_d_model, "Tables 2, 3: model width")->capture_default_str();
  app.add_option("--tp-d-ff", opt.tp_d_ff, "Tables 2, 3: expert hidden width")
      ->capture_default_str();
  app.add_option("--tp-experts", opt.tp_experts, "Table 2: experts per layer")
      ->capture_default_str();
  app.add_option("--tp-batch", opt.tp_batch, "Tables 2, 3: batch (compute-bound)")
      ->capture_default_str();
  app.add_option("--tp-seq", opt.tp_seq, "Tables 2, 3: sequence length")->capture_default_str();
  app.add_option("--small-batch", opt.small_batch, "Table 2: batch of the load-bound regime")
      ->capture_default_str();
  app.add_option("--small-seq", opt.small_seq, "Table 2: sequence of the load-bound regime")
      ->capture_default_str();
  app.add_option("--ab-experts", opt.ab_experts, "Table 3: experts per layer")
      ->capture_default_str();
  app.add_option("--ab-slots", opt.ab_slots, "Table 3: device slots")->capture_default_str();
  app.add_option("--ab-tier", opt.ab_tier,
                 "Table 3: the store's tier (host, ssd, or ssd-cold: ssd with the files dropped "
                 "from the page cache every --drop-ms)")
      ->capture_default_str()
      ->check(CLI::IsMember({"host", "ssd", "ssd-cold"}));
  app.add_option("--steps", opt.steps, "Timed steps per run")->capture_default_str();
  app.add_option("--warmup", opt.warmup, "Untimed steps per run first")->capture_default_str();
  app.add_option("--rounds", opt.rounds, "Tables 2, 3: alternated rounds (median)")
      ->capture_default_str();
  app.add_option("--overhead-mib", opt.overhead_mib, "Table 1: the bound's stated overhead")
      ->capture_default_str();
  app.add_option("--drop-ms", opt.drop_ms,
                 "Table 2: the ssd-cold rows drop the expert files from the page cache this often")
      ->capture_default_str();
  app.add_option("--threads", opt.threads, "Compute threads per run (0 = cores - 1)");
  app.add_option("--ssd-dir", opt.dir,
                 "Where the ssd runs' scratch files go (default: the temporary directory); a "
                 "subdirectory is made and removed");
  app.add_flag("--quick", opt.quick, "Small models, one round (a smoke run)");
  return tools::run_tool("moe-offload-train-bench", app, argc, argv, [&]() -> int {
    MOE_USAGE_CHECK(opt.steps >= 1 && opt.warmup >= 0 && opt.rounds >= 1,
                    "--steps and --rounds must be >= 1, --warmup >= 0");
    if (opt.quick) {
      opt.sweep = "4,16";
      opt.d_model = 32;
      opt.d_ff = 64;
      opt.batch = 2;
      opt.seq = 32;
      opt.host_budget = "384KiB";
      opt.tp_d_model = 64;
      opt.tp_d_ff = 128;
      opt.tp_batch = 4;
      opt.tp_seq = 32;
      opt.ab_experts = 8;
      opt.steps = 2;
      opt.rounds = 1;
    }
    return run_all(opt);
  });
}
