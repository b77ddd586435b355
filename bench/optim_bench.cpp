// moe-optim-bench: the CPU AdamW step (backend/cpu/adamw.cpp) over N parameters, against the
// memory ceilings measured in the same run: a STREAM triad, and a loop with AdamW's own access
// pattern (4 streams read, 3 written back) that does no arithmetic worth the name. Rows for each
// instruction-set path this CPU runs and for the scalar per-element loop the library used before
// (the "before"), for f32 parameters and for bf16 storage (the update plus the rounding into the
// storage dtype and the fp32 compute copy; before: three passes, now: one). Correctness column:
// max |ours - reference| over the masters (and storage) after one step from the same state.
// nccl-tests-style table on stdout, or one JSON object with --json. Not a test: nothing asserted.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/adamw.h"
#include "common/cli.h"
#include "core/parallel.h"
#include "kernels/adamw.h"
#include "kernels/convert.h"
#include "machine.h"
#include "moe/threads.h"
#include "moe/timer.h"

using namespace moe;

namespace {

struct Options {
  int64_t params = 50'000'000;
  bool quick = false, json = false;
  int threads = 0;
  double min_seconds = 2.0;  // in all, over the rounds
  int rounds = 4;
  std::vector<std::string> storage = {"f32", "bf16"};
};

// Bytes one parameter moves in one fused step: read grad, m, v, master; write m, v, master (28),
// plus, for bf16/f16 storage, the rounded value (2) and its fp32 compute copy (4) written.
double bytes_per_param(DType storage) { return storage == DType::f32 ? 28.0 : 34.0; }

// Best (smallest) seconds per call of fn after one warm-up, over >= min_runs calls and >=
// min_seconds: on a shared machine the best run is the least disturbed one.
double time_it(const std::function<void()>& fn, double min_seconds, int min_runs,
               int64_t* iterations) {
  fn();
  Timer total;
  double best = 0;
  int64_t n = 0;
  do {
    Timer one;
    fn();
    const double s = one.seconds();
    best = n == 0 ? s : std::min(best, s);
    ++n;
  } while (n < min_runs || total.seconds() < min_seconds);
  if (iterations) *iterations = n;
  return best;
}

// Arrays of one parameter's optimizer state, first touched by the threads that will use them.
struct Buffers {
  std::vector<float> master, m, v, grad, compute;
  std::vector<uint16_t> value;
  explicit Buffers(int64_t n, bool storage) {
    const size_t count = static_cast<size_t>(n);
    for (std::vector<float>* b : {&master, &m, &v, &grad}) b->resize(count);
    if (storage) {
      value.resize(count);
      compute.resize(count);
    }
    fill(0);
  }
  // Deterministic state with realistic magnitudes (weights ~0.02, gradients ~1e-3).
  void fill(uint64_t salt) {
    const int64_t n = static_cast<int64_t>(master.size());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float x = static_cast<float>((i * 2654435761u + salt) % 1000003) / 1000003.0f - 0.5f;
      master[i] = 0.04f * x;
      grad[i] = 2e-3f * x + 1e-4f;
      m[i] = 1e-4f * x;
      v[i] = 1e-6f * x * x;
      if (!value.empty()) {
        value[i] = 0;
        compute[i] = 0;
      }
    }
  }
  cpu::AdamWArrays arrays(DType storage) {
    cpu::AdamWArrays a{master.data(), m.data(), v.data(), grad.data()};
    if (storage != DType::f32) {
      a.value = value.data();
      a.value_dtype = storage;
      a.compute = compute.data();
    }
    return a;
  }
};

// The library's loop before vectorisation: the per-element kernel in one OpenMP loop (scalar
// divss/sqrtss: this file keeps the default math flags), then for bf16/f16 storage the rounding
// copy and the compute refresh as separate passes, as AdamW::step ran them.
void reference_step(Buffers& b, DType storage, const kernels::AdamWScalars& sc) {
  const int64_t n = static_cast<int64_t>(b.master.size());
  float* master = b.master.data();
  float* m = b.m.data();
  float* v = b.v.data();
  const float* g = b.grad.data();
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i) kernels::adamw_update(master[i], m[i], v[i], g[i], sc);
  if (storage == DType::f32) return;
  uint16_t* value = b.value.data();
  float* compute = b.compute.data();
  const bool bf16 = storage == DType::bf16;
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i)
    value[i] = bf16 ? kernels::f32_to_bf16(master[i]) : kernels::f32_to_f16(master[i]);
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i)
    compute[i] = bf16 ? kernels::bf16_to_f32(value[i]) : kernels::f16_to_f32(value[i]);
}

// One timed loop; rounds interleave all of them, and each keeps its best time over the rounds, so
// a burst of load from other processes does not land on one row (or the ceiling) alone.
struct Measure {
  std::string storage, path;
  double bytes = 0;  // per element: per parameter for steps, per element for the ceilings
  std::function<void()> fn;
  double best = 0;
  int64_t iterations = 0;
  double max_diff = 0;  // |ours - reference| after one step from the same state
  double rate(int64_t n) const { return static_cast<double>(n) / best; }
  double gbs(int64_t n) const { return rate(n) * bytes * 1e-9; }
};

void run_rounds(std::vector<Measure>& measures, int rounds, double min_seconds) {
  for (int r = 0; r < rounds; ++r)
    for (Measure& m : measures) {
      int64_t iterations = 0;
      const double s = time_it(m.fn, min_seconds / rounds, 2, &iterations);
      m.best = r == 0 ? s : std::min(m.best, s);
      m.iterations += iterations;
    }
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i)
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return d;
}

// Correctness on the first `n` parameters (the full N would need a second copy of all state):
// one step of `isa` and of the reference from the same state; the storage counts too (decoded).
double check(DType storage, cpu::VectorIsa isa, int64_t n, const kernels::AdamWScalars& sc) {
  Buffers ours(n, storage != DType::f32), ref(n, storage != DType::f32);
  cpu::adamw_update_arrays(ours.arrays(storage), n, sc, isa);
  reference_step(ref, storage, sc);
  double d = std::max(max_abs_diff(ours.master, ref.master), max_abs_diff(ours.m, ref.m));
  d = std::max(d, max_abs_diff(ours.v, ref.v));
  if (storage != DType::f32) d = std::max(d, max_abs_diff(ours.compute, ref.compute));
  return d;
}

int run(const Options& opt) {
  if (opt.threads > 0) set_num_threads(opt.threads);
  const int64_t n = opt.params;
  const int64_t check_n = std::min<int64_t>(n, int64_t(1) << 22);
  kernels::AdamWScalars sc{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.0f, 0.0f};
  sc.bias_correction1 = 1.0f - std::pow(sc.beta1, 10.0f);
  sc.bias_correction2 = 1.0f - std::pow(sc.beta2, 10.0f);
  std::vector<DType> storages;
  for (const std::string& name : opt.storage) {
    const DType storage = parse_dtype(name);
    if (storage != DType::f32 && storage != DType::bf16 && storage != DType::f16)
      throw UsageError(str("--storage: ", name, " is not a parameter dtype (f32, bf16, f16)"));
    storages.push_back(storage);
  }

  Buffers b(n, true);
  std::vector<Measure> measures;
  // Ceilings on the same arrays: STREAM triad a = b + s c (12 B per element as STREAM counts it,
  // the write-allocate read not counted) and AdamW's access pattern m += g, v += g^2, w += g (28 B
  // per element, as a step; v stays non-negative for the steps timed after it).
  measures.push_back({"", "triad", 12.0, [&] {
                        float* a = b.master.data();
                        const float* x = b.m.data();
                        const float* y = b.v.data();
#pragma omp parallel for schedule(static)
                        for (int64_t i = 0; i < n; ++i) a[i] = x[i] + 1.0001f * y[i];
                      }});
  measures.push_back({"", "pattern", 28.0, [&] {
                        float* w = b.master.data();
                        float* m = b.m.data();
                        float* v = b.v.data();
                        const float* g = b.grad.data();
#pragma omp parallel for schedule(static)
                        for (int64_t i = 0; i < n; ++i) {
                          m[i] += g[i];
                          v[i] += g[i] * g[i];
                          w[i] += g[i];
                        }
                      }});
  for (DType storage : storages) {
    const double bytes = bytes_per_param(storage);
    measures.push_back({dtype_name(storage), "before", bytes,
                        [&b, storage, sc] { reference_step(b, storage, sc); }});
    for (cpu::VectorIsa isa : cpu::vector_isas_supported()) {
      Measure m{dtype_name(storage), cpu::vector_isa_name(isa), bytes, [&b, storage, sc, isa, n] {
                  cpu::adamw_update_arrays(b.arrays(storage), n, sc, isa);
                }};
      if (isa == cpu::vector_isa_best()) m.path += "*";
      m.max_diff = check(storage, isa, check_n, sc);
      measures.push_back(std::move(m));
    }
  }
  b.fill(1);
  run_rounds(measures, opt.rounds, opt.min_seconds);
  const double triad = measures[0].gbs(n), pattern = measures[1].gbs(n);

  if (!opt.json) {
    const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
    std::printf("# moe-optim-bench: CPU AdamW step over %ld parameters (fp32 master, m, v, grad)\n",
                static_cast<long>(n));
    std::printf("# %s, %s, %d threads, OMP_WAIT_POLICY=%s\n", bench::now_utc().c_str(),
                bench::cpu_model().c_str(), num_threads(), wait_policy ? wait_policy : "(unset)");
    std::printf(
        "# ceilings on the same arrays: triad a = b + s c, %.1f GB/s at 12 B/element "
        "(STREAM's count: the write-allocate read is not counted); AdamW's pattern "
        "m += g, v += g^2, w += g, %.1f GB/s at 28 B/element\n",
        triad, pattern);
    std::printf(
        "# step: f32 = the update alone, 28 B/param; bf16/f16 = update + rounded storage + "
        "fp32 compute copy, 34 B/param (GB/s = param/s x B/param)\n");
    std::printf(
        "# before: the per-element kernel in a scalar OpenMP loop (+ two conversion "
        "passes for bf16/f16); * = the path the library takes on this CPU\n");
    std::printf(
        "# time: best over %d interleaved rounds of >= 2 runs after a warm-up; triad%%, "
        "pattern%% = GB/s / ceiling; max_diff: max |ours - before| over the first %ld "
        "params after one step from the same state\n",
        opt.rounds, static_cast<long>(check_n));
    std::printf("# %7s %10s %9s %10s %8s %8s %9s %10s\n", "storage", "path", "time", "rate", "rate",
                "triad", "pattern", "max_diff");
    std::printf("# %7s %10s %9s %10s %8s %8s %9s %10s\n", "", "", "(ms)", "(param/s)", "(GB/s)",
                "(%)", "(%)", "(abs)");
    for (size_t i = 2; i < measures.size(); ++i) {
      const Measure& m = measures[i];
      std::printf("  %7s %10s %9.2f %10.3e %8.1f %8.1f %9.1f %10.2e\n", m.storage.c_str(),
                  m.path.c_str(), m.best * 1e3, m.rate(n), m.gbs(n), 100.0 * m.gbs(n) / triad,
                  100.0 * m.gbs(n) / pattern, m.max_diff);
    }
  } else {
    nlohmann::json out;
    out["benchmark"] = "optim-adamw";
    out["date"] = bench::now_utc();
    out["cpu"] = bench::cpu_model();
    out["threads"] = num_threads();
    out["params"] = n;
    out["checked_params"] = check_n;
    out["rounds"] = opt.rounds;
    out["triad_gbs"] = triad;
    out["pattern_gbs"] = pattern;
    out["library_path"] = cpu::vector_isa_name(cpu::vector_isa_best());
    for (size_t i = 2; i < measures.size(); ++i) {
      const Measure& m = measures[i];
      out["rows"].push_back({{"storage", m.storage},
                             {"path", m.path},
                             {"seconds", m.best},
                             {"iterations", m.iterations},
                             {"params_per_s", m.rate(n)},
                             {"gbs", m.gbs(n)},
                             {"triad_ratio", m.gbs(n) / triad},
                             {"pattern_ratio", m.gbs(n) / pattern},
                             {"max_diff", m.max_diff}});
    }
    std::cout << out.dump(2) << "\n";
  }
  return tools::finish_stdout("moe-optim-bench");
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "CPU AdamW step: params/s and GB/s of each instruction-set path and of the scalar loop it "
      "replaced, against a triad and AdamW's access pattern measured in the same run.",
      "moe-optim-bench"};
  app.add_option("--params", opt.params, "Parameters updated per step (default 50000000)")
      ->check(tools::positive());
  app.add_option("--storage", opt.storage, "Parameter storage dtypes, one table block each")
      ->delimiter(',')
      ->capture_default_str();
  app.add_flag("--quick", opt.quick, "4M parameters, 0.2 s per row (smoke run)");
  app.add_flag("--json", opt.json, "One JSON object on stdout instead of the table");
  app.add_option("--threads", opt.threads, "OpenMP threads (0: the library default)")
      ->check(tools::non_negative());
  CLI::Option* min_time =
      app.add_option("--min-time", opt.min_seconds,
                     "Seconds each row is timed, over all rounds (default 2; 0.2 with --quick)")
          ->check(tools::non_negative());
  app.add_option("--rounds", opt.rounds,
                 "Interleaved rounds over all rows; each row keeps its best time (default 4)")
      ->check(tools::positive());
  CLI::Option* params = app.get_option("--params");
  return tools::run_tool("moe-optim-bench", app, argc, argv, [&] {
    if (opt.quick && !min_time->count()) opt.min_seconds = 0.2;
    if (opt.quick && !params->count()) opt.params = int64_t(1) << 22;
    return run(opt);
  });
}
