// moe-bench: MoE layer forward+backward throughput on the CPU backend, against the dense sgemm
// rate of a comparable GEMM measured in the same run (the ceiling), with a correctness column
// (fast forward vs the per-token reference on a slice of tokens), and the GEMM tile kernels
// (this host's and CBLAS) side by side on the products the library runs. nccl-tests-style
// tables on stdout, or one JSON object with --json. Not a test: nothing is asserted.
// Shapes: N tokens, D model width, F = 4D expert hidden width, E experts, k top-k, M = N*k rows.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "common/cli.h"
#include "decode_bench.h"
#include "fma_peak.h"
#include "machine.h"
#include "moe/arena.h"
#include "moe/cuda.h"
#include "moe/models/memory.h"
#include "moe/nn/moe_layer.h"
#include "moe/nn/moe_reference.h"
#include "moe/ops/core.h"
#include "moe/ops/moe.h"
#include "moe/rng.h"
#include "moe/threads.h"
#include "moe/timer.h"

// OpenBLAS's build description, when the CBLAS in use is OpenBLAS (weak: any CBLAS links).
extern "C" char* openblas_get_config() __attribute__((weak));
extern "C" int openblas_get_parallel() __attribute__((weak));

using namespace moe;
using namespace moe::nn;

namespace {

struct Options {
  bool quick = false, json = false;
  int streams = 0;  // --device cuda: cuda::set_expert_streams (0: the library's default)
  int threads = 0;
  double min_seconds = 0.5;
  std::vector<int64_t> shape;  // --shape D,E,k,N: one row only
  std::string device = "cpu";
};

struct Shape4 {
  int64_t d_model, experts, top_k, tokens;
};

struct CeilingRow {
  int64_t m, k, n;
  double seconds, gflops;              // the BLAS's own threaded sgemm, one call
  double tiled_seconds, tiled_gflops;  // the library's deterministic tiled cpu::sgemm (its kernel)
  double blas_seconds, blas_gflops;    // the same tiles, each one single-threaded CBLAS call
  // The machine's ceiling: the fastest of the ways to run the dense product.
  double best() const { return std::max({gflops, tiled_gflops, blas_gflops}); }
};

// One product of the GEMM kernel table: each tile kernel on the same operands, in the same run.
struct KernelRow {
  const char* what;
  bool transpose_a, transpose_b;
  int64_t m, n, k;
  double blas_gflops, host_gflops;
  double max_rel_diff;  // max |host - blas| / max |blas|
};

struct MoERow {
  Shape4 shape;
  int64_t d_ff;
  double seconds, tokens_per_s, gflops, ceiling, ratio, max_rel_err;
  double vendor_seconds;  // the same layer with every GEMM handed whole to the threaded BLAS
  double blas_seconds;    // the same layer, tiled, with the CBLAS tile kernel
  int64_t iterations, dropped;
};

Tensor random_tensor(Shape shape, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(std::move(shape));
  float* p = t.data<float>();
  const uint64_t key = rng_key(seed, {0xbe7c});
  const int64_t n = t.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = scale * rng_normal(key, static_cast<uint64_t>(i));
  return t;
}

// Runs fn once to warm up, then at least `min_runs` times and at least min_seconds in all;
// returns the best (smallest) seconds per call: on a shared machine the best run is the one least
// disturbed by other processes, for the ceiling and the layer alike.
double time_it(const std::function<void()>& fn, double min_seconds, int min_runs,
               int64_t* iterations) {
  fn();
  Timer total;
  double best = 0;
  int64_t n = 0;
  do {
    Timer one;
    fn();
    double s = one.seconds();
    best = n == 0 ? s : std::min(best, s);
    ++n;
  } while (n < min_runs || total.seconds() < min_seconds);
  if (iterations) *iterations = n;
  return best;
}

// How cpu::sgemm runs during one measurement: tiled (the library's path) with a tile kernel, or
// each product whole to the threaded BLAS (`vendor`).
struct GemmMode {
  cpu::GemmPath path;
  cpu::GemmKernel kernel;
};
// This host's kernel (CPU features, MOE_GEMM), first asked at the start of run(), inside
// run_tool (a bad MOE_GEMM is a usage error there) and before time_modes switches kernels.
cpu::GemmKernel host_kernel() {
  static const cpu::GemmKernel kernel = cpu::gemm_kernel();
  return kernel;
}
GemmMode tiled_mode() { return {cpu::GemmPath::tiled, host_kernel()}; }
GemmMode tiled_blas_mode() { return {cpu::GemmPath::tiled, cpu::GemmKernel::blas}; }
GemmMode vendor_mode() { return {cpu::GemmPath::vendor_threaded, cpu::GemmKernel::blas}; }

// Times fn under each mode, the modes taking turns (A B C A B C ...: on a shared machine a
// slow spell then hits every mode alike, so their ratios hold), after one warm-up run each, for
// at least `min_runs` rounds and min_seconds per mode; returns each mode's best seconds per call
// and restores the library's tiled path and kernel.
std::vector<double> time_modes(const std::vector<GemmMode>& modes, const std::function<void()>& fn,
                               double min_seconds, int min_runs, int64_t* rounds = nullptr) {
  auto run_in = [&](const GemmMode& mode) {
    cpu::set_gemm_path(mode.path);
    cpu::set_gemm_kernel(mode.kernel);
    Timer one;
    fn();
    return one.seconds();
  };
  for (const GemmMode& mode : modes) run_in(mode);
  std::vector<double> best(modes.size(), 0.0);
  Timer total;
  int64_t n = 0;
  do {
    for (size_t i = 0; i < modes.size(); ++i) {
      const double s = run_in(modes[i]);
      best[i] = n == 0 ? s : std::min(best[i], s);
    }
    ++n;
  } while (n < min_runs || total.seconds() < min_seconds * static_cast<double>(modes.size()));
  cpu::set_gemm_path(cpu::GemmPath::tiled);
  cpu::set_gemm_kernel(host_kernel());
  if (rounds) *rounds = n;
  return best;
}

CeilingRow measure_ceiling(int64_t m, int64_t k, int64_t n, double min_seconds) {
  Tensor a = random_tensor({m, k}, 1, 1.0f), b = random_tensor({k, n}, 2, 1.0f);
  Tensor c = Tensor::zeros({m, n});
  auto gemm = [&] {
    cpu::sgemm(false, false, m, n, k, 1.0f, a.data<float>(), k, b.data<float>(), n, 0.0f,
               c.data<float>(), n);
  };
  const double flops = 2.0 * static_cast<double>(m) * k * n;
  const std::vector<double> t =
      time_modes({vendor_mode(), tiled_mode(), tiled_blas_mode()}, gemm, min_seconds, 5);
  const double vendor = t[0], tiled = t[1], blas = t[2];
  return {m,
          k,
          n,
          vendor,
          flops / vendor * 1e-9,
          tiled,
          flops / tiled * 1e-9,
          blas,
          flops / blas * 1e-9};
}

// One product through the tiled path with each kernel (the library calls these: expert forward
// NN, expert dX NT, expert dW TN, attention scores NT and context NN).
KernelRow measure_kernels(const char* what, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                          double min_seconds) {
  Tensor a = random_tensor({ta ? k : m, ta ? m : k}, 11, 1.0f);
  Tensor b = random_tensor({tb ? n : k, tb ? k : n}, 12, 1.0f);
  Tensor c = Tensor::zeros({m, n}), c_blas = Tensor::zeros({m, n});
  auto gemm = [&] {
    // Each kernel writes its own C, compared below.
    Tensor& out = cpu::gemm_kernel() == cpu::GemmKernel::blas ? c_blas : c;
    cpu::sgemm(ta, tb, m, n, k, 1.0f, a.data<float>(), ta ? m : k, b.data<float>(), tb ? k : n,
               0.0f, out.data<float>(), n);
  };
  const double flops = 2.0 * static_cast<double>(m) * n * k;
  const std::vector<double> t = time_modes({tiled_blas_mode(), tiled_mode()}, gemm, min_seconds, 5);
  const double blas = t[0], host = t[1];
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    diff = std::max(diff, std::fabs(double(c.data<float>()[i]) - c_blas.data<float>()[i]));
    scale = std::max(scale, std::fabs(double(c_blas.data<float>()[i])));
  }
  return {what,
          ta,
          tb,
          m,
          n,
          k,
          flops / blas * 1e-9,
          flops / host * 1e-9,
          scale > 0 ? diff / scale : diff};
}

// Refuses a row whose host memory cannot fit before anything is allocated (moe/models/memory.h),
// instead of std::bad_alloc or the OOM killer part-way through the table. A lower bound: the
// layer's expert weights w1 and w2 [E, 4D, D] in fp32 live on the host in both runs (on a GPU
// until they are copied over); the CPU run also holds the routed tokens' hidden activations
// [N k, 4D] and the ceiling product's output of the same size.
void check_shape_fits(const Shape4& s, bool on_gpu) {
  const double D = double(s.d_model), F = 4 * D, E = double(s.experts);
  const double M = double(s.tokens) * double(s.top_k);
  const double floats = 2 * E * F * D + (on_gpu ? 0 : 2 * M * F);
  check_fits_in_memory(
      4 * floats,
      str("moe-bench row D ", s.d_model, ", E ", s.experts, ", k ", s.top_k, ", N ", s.tokens),
      on_gpu ? "fp32 expert weights, filled on the host"
             : "fp32 expert weights and hidden activations");
}

MoERow measure_moe(const Shape4& shape, double ceiling, double min_seconds) {
  const int64_t D = shape.d_model, F = 4 * D, E = shape.experts, k = shape.top_k, N = shape.tokens;
  MoEConfig config;
  config.router.d_model = D;
  config.router.num_experts = E;
  config.router.top_k = k;
  config.experts = ExpertsConfig{E, D, F, Activation::gelu, true};
  ParamSet ps(7);
  MoELayer layer(ps, "bench.moe", config);
  Tensor x = random_tensor({N, D}, 3, 1.0f);
  Tensor dy = random_tensor({N, D}, 4, 1.0f);
  Arena arena;
  int64_t dropped = 0;
  int64_t iterations = 0;
  const RouterStep step{7, 0, 0, true};
  auto layer_step = [&] {
    arena.reset();
    ArenaScope scope(arena);
    MoELayer::Saved saved;
    MoEStats stats;
    Tensor y = layer.forward(x, step, &saved, &stats);
    Tensor dx = layer.backward(dy, saved, 0.01f, 0.001f);
    dropped = stats.dropped;
  };
  const std::vector<double> t = time_modes({tiled_mode(), vendor_mode(), tiled_blas_mode()},
                                           layer_step, min_seconds, 2, &iterations);
  const double seconds = t[0], vendor_seconds = t[1], blas_seconds = t[2];
  // Expert GEMMs: 2 forward + 4 backward of 2*M*D*F flops; router: 1 forward + 2 backward of
  // 2*N*D*E.
  const double flops =
      12.0 * static_cast<double>(N * k) * D * F + 6.0 * static_cast<double>(N) * D * E;
  const double gflops = flops / seconds * 1e-9;

  // Correctness: the fast forward against the fp64 per-token reference on the first tokens
  // (dropless routing is per token, so a slice routes exactly as in the full batch).
  const int64_t slice = std::min<int64_t>(N, 8);
  const RouterStep eval{7, 0, 0, false};
  Tensor y = layer.forward(x, eval, nullptr, nullptr);
  MoEReferenceResult ref = moe_reference(ps, "bench.moe", config, x.rows(0, slice), eval);
  const float* fast = y.data<float>();
  const float* slow = ref.y.data<float>();
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < slice * D; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(fast[i]) - slow[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(slow[i])));
  }
  MoERow row;
  row.shape = shape;
  row.d_ff = F;
  row.seconds = seconds;
  row.vendor_seconds = vendor_seconds;
  row.blas_seconds = blas_seconds;
  row.tokens_per_s = static_cast<double>(N) / seconds;
  row.gflops = gflops;
  row.ceiling = ceiling;
  row.ratio = gflops / ceiling;
  row.max_rel_err = scale > 0 ? diff / scale : diff;
  row.iterations = iterations;
  row.dropped = dropped;
  return row;
}

std::string blas_description() {
  if (!openblas_get_config) return "a CBLAS (not OpenBLAS)";
  std::string d = openblas_get_config();
  if (openblas_get_parallel) {
    int p = openblas_get_parallel();
    d += p == 2 ? " (OpenMP threads)" : p == 1 ? " (pthreads)" : " (sequential)";
  }
  return d;
}

int run(const Options& opt) {
  host_kernel();  // settled before any measurement switches kernels
  if (opt.threads > 0) set_num_threads(opt.threads);
  std::vector<Shape4> shapes;
  if (!opt.shape.empty()) {
    shapes.push_back({opt.shape[0], opt.shape[1], opt.shape[2], opt.shape[3]});
  } else if (opt.quick) {
    for (int64_t e : {8, 32})
      for (int64_t k : {1, 2}) shapes.push_back({64, e, k, 256});
  } else {
    for (int64_t d : {512, 1024})
      for (int64_t e : {8, 32})
        for (int64_t k : {1, 2}) shapes.push_back({d, e, k, 4096});
  }
  for (const Shape4& s : shapes) check_shape_fits(s, false);
  // One ceiling per distinct expert-GEMM shape [N*k, D] x [D, F].
  std::vector<CeilingRow> ceilings;
  auto ceiling_for = [&](const Shape4& s) -> const CeilingRow& {
    for (const CeilingRow& c : ceilings)
      if (c.m == s.tokens * s.top_k && c.k == s.d_model) return c;
    ceilings.push_back(
        measure_ceiling(s.tokens * s.top_k, s.d_model, 4 * s.d_model, opt.min_seconds));
    return ceilings.back();
  };
  for (const Shape4& s : shapes) ceiling_for(s);
  // The products the library runs at each distinct d_model (T = 256-token attention, 64 per head).
  std::vector<KernelRow> kernel_rows;
  std::vector<int64_t> widths;
  for (const Shape4& s : shapes)
    if (std::find(widths.begin(), widths.end(), s.d_model) == widths.end())
      widths.push_back(s.d_model);
  for (int64_t D : widths) {
    const int64_t M = opt.quick ? 512 : 4096, F = 4 * D, T = opt.quick ? 64 : 256, hd = 64;
    kernel_rows.push_back(measure_kernels("expert x W1", false, false, M, F, D, opt.min_seconds));
    kernel_rows.push_back(measure_kernels("expert dX", false, true, M, D, F, opt.min_seconds));
    kernel_rows.push_back(measure_kernels("expert dW", true, false, D, F, M, opt.min_seconds));
    kernel_rows.push_back(measure_kernels("dense x W^T", false, true, M, D, D, opt.min_seconds));
    kernel_rows.push_back(measure_kernels("attn Q K^T", false, true, T, T, hd, opt.min_seconds));
    kernel_rows.push_back(measure_kernels("attn P V", false, false, T, hd, T, opt.min_seconds));
  }
  const double fma_peak = bench::fma_peak_gflops();
  const bool table = !opt.json;
  if (table) {
    std::printf(
        "# moe-bench: MoE layer forward+backward, gpt flavour (gelu + bias, F = 4D), dropless, "
        "fp32\n");
    const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
    std::printf("# %s, %s, %d threads, OMP_WAIT_POLICY=%s\n", bench::now_utc().c_str(),
                bench::cpu_model().c_str(), num_threads(), wait_policy ? wait_policy : "(unset)");
    std::printf("# BLAS: %s\n", blas_description().c_str());
    const char* gemm_env = std::getenv("MOE_GEMM");
    std::printf("# GEMM tile kernel: %s (CPU features; MOE_GEMM=%s)\n",
                cpu::gemm_kernel_name(host_kernel()), gemm_env ? gemm_env : "(unset)");
    std::printf(
        "# FMA peak: %.1f GFLOP/s (fused multiply-adds on registers only, every thread: no GEMM "
        "can run faster)\n",
        fma_peak);
    std::printf(
        "#\n# dense sgemm C[M,N] = A[M,K] B[K,N] (the expert GEMM shape [N*k, D] x [D, 4D]): "
        "vendor = one call to the BLAS with its own threads\n");
    std::printf(
        "# tiled: the same product through cpu::sgemm (tiles fixed by shape, one tile kernel call "
        "each from our OpenMP loop: the library's deterministic path) with this host's kernel; "
        "blas: the same tiles, each a single-threaded CBLAS call\n");
    std::printf(
        "# tiled/vendor, tiled/blas: rate ratios; the ceiling below is the fastest of the "
        "three\n");
    std::printf("# %8s %8s %8s %10s %10s %10s %10s %10s %10s %7s %7s\n", "M", "K", "N", "vendor",
                "vendor", "blas", "blas", "tiled", "tiled", "t/vend", "t/blas");
    std::printf("# %8s %8s %8s %10s %10s %10s %10s %10s %10s %7s %7s\n", "", "", "", "(ms)",
                "(GFLOP/s)", "(ms)", "(GFLOP/s)", "(ms)", "(GFLOP/s)", "(%)", "(%)");
    for (const CeilingRow& c : ceilings)
      std::printf("  %8ld %8ld %8ld %10.2f %10.1f %10.2f %10.1f %10.2f %10.1f %7.1f %7.1f\n",
                  static_cast<long>(c.m), static_cast<long>(c.k), static_cast<long>(c.n),
                  c.seconds * 1e3, c.gflops, c.blas_seconds * 1e3, c.blas_gflops,
                  c.tiled_seconds * 1e3, c.tiled_gflops, 100.0 * c.tiled_gflops / c.gflops,
                  100.0 * c.tiled_gflops / c.blas_gflops);
    std::printf(
        "#\n# GEMM tile kernels by product (tiled path): C[M,N] = op(A)[M,K] op(B)[K,N], N/T = "
        "op is identity/transpose; %s = this host's kernel; diff = max |%s - blas| / max |blas|\n",
        cpu::gemm_kernel_name(host_kernel()), cpu::gemm_kernel_name(host_kernel()));
    std::printf("# %-12s %2s %6s %6s %6s %10s %10s %7s %10s\n", "product", "op", "M", "N", "K",
                "blas", cpu::gemm_kernel_name(host_kernel()), "ratio", "diff");
    std::printf("# %-12s %2s %6s %6s %6s %10s %10s %7s %10s\n", "", "", "", "", "", "(GFLOP/s)",
                "(GFLOP/s)", "(x)", "(rel)");
    for (const KernelRow& r : kernel_rows)
      std::printf("  %-12s %c%c %6ld %6ld %6ld %10.1f %10.1f %7.2f %10.2e\n", r.what,
                  r.transpose_a ? 'T' : 'N', r.transpose_b ? 'T' : 'N', static_cast<long>(r.m),
                  static_cast<long>(r.n), static_cast<long>(r.k), r.blas_gflops, r.host_gflops,
                  r.host_gflops / r.blas_gflops, r.max_rel_diff);
    std::printf(
        "#\n# MoE layer: router + dispatch + grouped expert GEMM + combine, forward and "
        "backward\n");
    std::printf(
        "# flops: 12 N k D F (expert GEMMs) + 6 N D E (router); ratio = rate / ceiling of the same "
        "[N*k, D] x [D, F]\n");
    std::printf(
        "# time: best of >= 2 runs after a warm-up (ceiling: best of >= 5); the GEMM modes of a "
        "row take turns run by run\n");
    std::printf(
        "# vendor: the same layer with every GEMM handed whole to the threaded BLAS (the path "
        "before "
        "2026-11-25, not thread-count deterministic); det/vendor = vendor time / time\n");
    std::printf(
        "# blas: the same layer, tiled, with the CBLAS tile kernel; blas/tiled = blas time / "
        "time\n");
    std::printf(
        "# correctness: max |fast - reference| / max |reference| of the forward on the first 8 "
        "tokens\n");
    std::printf("# %7s %6s %4s %3s %7s %10s %10s %10s %10s %7s %10s %10s %10s %10s %10s\n",
                "d_model", "d_ff", "E", "k", "tokens", "time", "rate", "rate", "ceiling", "ratio",
                "max_err", "vendor", "det/vendor", "blas", "blas/tiled");
    std::printf("# %7s %6s %4s %3s %7s %10s %10s %10s %10s %7s %10s %10s %10s %10s %10s\n", "", "",
                "", "", "", "(ms)", "(tok/s)", "(GFLOP/s)", "(GFLOP/s)", "(%)", "(rel)", "(ms)",
                "(x)", "(ms)", "(x)");
    std::fflush(stdout);
  }
  std::vector<MoERow> rows;
  for (const Shape4& s : shapes) {
    MoERow r = measure_moe(s, ceiling_for(s).best(), opt.min_seconds);
    rows.push_back(r);
    if (table) {
      std::printf(
          "  %7ld %6ld %4ld %3ld %7ld %10.2f %10.0f %10.1f %10.1f %7.1f %10.2e %10.2f %10.3f "
          "%10.2f %10.3f\n",
          static_cast<long>(s.d_model), static_cast<long>(r.d_ff), static_cast<long>(s.experts),
          static_cast<long>(s.top_k), static_cast<long>(s.tokens), r.seconds * 1e3, r.tokens_per_s,
          r.gflops, r.ceiling, 100.0 * r.ratio, r.max_rel_err, r.vendor_seconds * 1e3,
          r.vendor_seconds / r.seconds, r.blas_seconds * 1e3, r.blas_seconds / r.seconds);
      std::fflush(stdout);
    }
  }
  if (opt.json) {
    nlohmann::json out;
    out["benchmark"] = "moe-layer";
    out["date"] = bench::now_utc();
    out["cpu"] = bench::cpu_model();
    out["blas"] = blas_description();
    out["threads"] = num_threads();
    out["gemm_kernel"] = cpu::gemm_kernel_name(host_kernel());
    out["fma_peak_gflops"] = fma_peak;
    const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
    out["omp_wait_policy"] = wait_policy ? wait_policy : "";
    for (const CeilingRow& c : ceilings)
      out["ceiling"].push_back({{"m", c.m},
                                {"k", c.k},
                                {"n", c.n},
                                {"seconds", c.seconds},
                                {"gflops", c.gflops},
                                {"tiled_seconds", c.tiled_seconds},
                                {"tiled_gflops", c.tiled_gflops},
                                {"blas_seconds", c.blas_seconds},
                                {"blas_gflops", c.blas_gflops}});
    for (const KernelRow& r : kernel_rows)
      out["gemm_kernels"].push_back({{"product", r.what},
                                     {"transpose_a", r.transpose_a},
                                     {"transpose_b", r.transpose_b},
                                     {"m", r.m},
                                     {"n", r.n},
                                     {"k", r.k},
                                     {"blas_gflops", r.blas_gflops},
                                     {"host_gflops", r.host_gflops},
                                     {"max_rel_diff", r.max_rel_diff}});
    for (const MoERow& r : rows)
      out["rows"].push_back({{"d_model", r.shape.d_model},
                             {"d_ff", r.d_ff},
                             {"experts", r.shape.experts},
                             {"top_k", r.shape.top_k},
                             {"tokens", r.shape.tokens},
                             {"seconds", r.seconds},
                             {"vendor_seconds", r.vendor_seconds},
                             {"blas_seconds", r.blas_seconds},
                             {"iterations", r.iterations},
                             {"tokens_per_s", r.tokens_per_s},
                             {"gflops", r.gflops},
                             {"ceiling_gflops", r.ceiling},
                             {"ratio", r.ratio},
                             {"max_rel_err", r.max_rel_err},
                             {"dropped", r.dropped}});
    std::cout << out.dump(2) << "\n";
  }
  return tools::finish_stdout("moe-bench");
}

// ---- --device cuda: the same layer on a GPU, against cuBLAS.
// Per shape: the dense ceiling is one cuBLAS sgemm [M, D] x [D, F] (M = N*k, the expert GEMM's
// FLOPs in one matrix); the grouped expert GEMM runs the same FLOPs as E segments of skewed sizes
// (ops::grouped_gemm, one cublasSgemm per segment); the layer row is forward+backward with the
// parameters and tokens on the device. Every timing ends with a device synchronisation.
int run_cuda(const Options& opt) {
  const Device gpu = Device::parse(opt.device);
  MOE_CHECK(cuda::available(), "--device ", gpu.str(), ": ", cuda::unavailable_reason());
  cuda::set_device(gpu.index);
  if (opt.streams > 0) cuda::set_expert_streams(opt.streams);
  auto timed = [&](const std::function<void()>& fn, int runs, int64_t* iterations) {
    return time_it(
        [&] {
          fn();
          cuda::synchronize(gpu.index);
        },
        opt.min_seconds, runs, iterations);
  };
  std::vector<Shape4> shapes;
  if (!opt.shape.empty()) {
    shapes.push_back({opt.shape[0], opt.shape[1], opt.shape[2], opt.shape[3]});
  } else if (opt.quick) {
    shapes.push_back({256, 8, 2, 2048});
  } else {
    // D 4096 with 64 experts is left out: its weights (64 x 16384 x 4096 floats, 17 GB for the
    // GEMM rows and twice that in the layer) are about 50 GB of host memory to fill before they
    // reach the GPU, which took longer than the rest of the table. --shape runs it.
    for (int64_t d : {1024, 2048})
      for (int64_t e : {8, 64}) shapes.push_back({d, e, 2, 8192});
    shapes.push_back({4096, 8, 2, 8192});
  }
  for (const Shape4& s : shapes) check_shape_fits(s, true);
  std::printf("# moe-bench --device %s: %s, %s, expert streams %d\n", gpu.str().c_str(),
              cuda::device_name(gpu.index).c_str(), bench::now_utc().c_str(),
              cuda::expert_streams());
  std::printf("# dense: cuBLAS sgemm [M,D]x[D,F], M = N*k, F = 4D (the ceiling, same run)\n");
  std::printf(
      "# grouped: the same FLOPs as E expert segments (sizes skewed 1:3), one sgemm each, spread "
      "over the expert streams\n");
  std::printf(
      "# layer: MoE layer forward+backward (gpt flavour, dropless), GFLOP/s as moe-bench\n");
  std::printf("# %6s %4s %3s %7s %10s %10s %7s %10s %7s\n", "D", "E", "k", "N", "dense", "grouped",
              "ratio", "layer", "ratio");
  std::printf("# %6s %4s %3s %7s %10s %10s %7s %10s %7s\n", "", "", "", "", "(GFLOP/s)",
              "(GFLOP/s)", "", "(GFLOP/s)", "");
  for (const Shape4& s : shapes) {
    const int64_t D = s.d_model, F = 4 * D, E = s.experts, M = s.tokens * s.top_k;
    const double gemm_flops = 2.0 * static_cast<double>(M) * D * F;
    Tensor a = random_tensor({M, D}, 1, 1.0f).to(gpu);
    Tensor w = random_tensor({E, F, D}, 2, 0.02f).to(gpu);
    Tensor c = Tensor::empty({M, F}, DType::f32, gpu);
    Tensor w0 = w.reshape({E * F, D}).rows(0, F);
    const double dense = timed([&] { ops::gemm(a, false, w0, true, c); }, 5, nullptr);
    std::vector<int32_t> offsets(static_cast<size_t>(E) + 1, 0);
    int64_t weight_sum = 0;
    for (int64_t e = 0; e < E; ++e) weight_sum += 1 + 2 * (e % 2);
    for (int64_t e = 0, acc = 0; e < E; ++e) {
      acc += 1 + 2 * (e % 2);
      offsets[static_cast<size_t>(e) + 1] = static_cast<int32_t>(M * acc / weight_sum);
    }
    const double grouped = timed([&] { ops::grouped_gemm(a, w, true, offsets, c); }, 5, nullptr);

    MoEConfig config;
    config.router.d_model = D;
    config.router.num_experts = E;
    config.router.top_k = s.top_k;
    config.experts = ExpertsConfig{E, D, F, Activation::gelu, true};
    ParamSet ps(7);
    MoELayer layer(ps, "bench.moe", config);
    ps.to(gpu);
    Tensor x = random_tensor({s.tokens, D}, 3, 1.0f).to(gpu);
    Tensor dy = random_tensor({s.tokens, D}, 4, 1.0f).to(gpu);
    const RouterStep step{7, 0, 0, true};
    const double layer_s = timed(
        [&] {
          MoELayer::Saved saved;
          Tensor y = layer.forward(x, step, &saved, nullptr);
          Tensor dx = layer.backward(dy, saved, 0.01f, 0.001f);
        },
        2, nullptr);
    const double layer_flops =
        12.0 * static_cast<double>(M) * D * F + 6.0 * static_cast<double>(s.tokens) * D * E;
    const double dense_rate = gemm_flops / dense * 1e-9, grouped_rate = gemm_flops / grouped * 1e-9;
    const double layer_rate = layer_flops / layer_s * 1e-9;
    std::printf("  %6ld %4ld %3ld %7ld %10.0f %10.0f %7.2f %10.0f %7.2f\n", static_cast<long>(D),
                static_cast<long>(E), static_cast<long>(s.top_k), static_cast<long>(s.tokens),
                dense_rate, grouped_rate, grouped_rate / dense_rate, layer_rate,
                layer_rate / dense_rate);
    std::fflush(stdout);  // each row as it is measured, also through a pipe
  }
  return tools::finish_stdout("moe-bench");
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "MoE layer (gpt flavour, F = 4D, dropless) forward+backward tokens/s and GFLOP/s against the "
      "dense sgemm rate measured in the same run.",
      "moe-bench"};
  app.add_flag("--quick", opt.quick, "Small shapes (smoke run)");
  app.add_flag("--json", opt.json, "One JSON object on stdout instead of the table");
  app.add_option("--threads", opt.threads, "OpenMP and BLAS threads (0: the library default)")
      ->check(tools::non_negative());
  CLI::Option* min_time =
      app.add_option("--min-time", opt.min_seconds,
                     "Seconds each measurement runs at least (default 0.5; 0.05 with --quick)")
          ->check(tools::non_negative());
  app.add_option("--device", opt.device,
                 "cpu, or cuda[:N]: grouped expert GEMM and the layer against cuBLAS on that GPU")
      ->capture_default_str();
  app.add_option("--streams", opt.streams,
                 "--device cuda: streams the grouped GEMM spreads its per-expert calls over (1-16; "
                 "default: the library's, 4)")
      ->check(CLI::Range(1, 16));
  app.add_option("--shape", opt.shape, "One row: d_model D, E experts, top-k k, N tokens")
      ->delimiter(',')
      ->expected(4)
      ->type_name("D,E,k,N")
      ->check(tools::positive());
  // --decode: the decode/prefill table instead (bench/decode_bench.cpp).
  bool decode = false;
  bench::DecodeOptions decode_opt;
  app.add_flag("--decode", decode,
               "Decode (batch 1, 8) and prefill tokens/s of a Mixtral-shaped model per weight "
               "dtype, against the memory-bandwidth bound");
  app.add_option("--dtypes", decode_opt.dtypes,
                 "--decode: weight dtypes (default f32,bf16,f16,q8_0); q4_k, q6_k, mxfp4: a "
                 "table of the GEMV alone per instruction-set path instead of model rows")
      ->delimiter(',');
  return tools::run_tool("moe-bench", app, argc, argv, [&] {
    if (decode) {
      decode_opt.quick = opt.quick;
      decode_opt.threads = opt.threads;
      if (min_time->count()) decode_opt.min_seconds = opt.min_seconds;
      return bench::run_decode(decode_opt);
    }
    if (!opt.shape.empty() && opt.shape[2] > opt.shape[1])
      throw UsageError(
          str("--shape: top-k ", opt.shape[2], " exceeds the ", opt.shape[1], " experts"));
    if (opt.quick && !min_time->count()) opt.min_seconds = 0.05;
    if (Device::parse(opt.device).kind == Device::cuda) return run_cuda(opt);
    return run(opt);
  });
}
