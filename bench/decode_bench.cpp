// moe-bench --decode: tokens/s of a Mixtral-shaped model (random weights, no file) at batch-1 and
// batch-8 decode and at a 512-token prefill, per weight dtype, against the memory-bandwidth bound
// measured in the same run: a streaming read over a buffer far larger than the caches (all
// threads, best of several passes) divided by the weight bytes one decode step must read.
//
// Decode reads every active weight once per step: the non-expert matrices whole, k of each MoE
// layer's E experts per token (batch 1), and at batch B the experts the B tokens touch (expected
// E (1 - (1 - k/E)^B) under uniform routing; that is the bound's assumption). KV-cache reads are
// left out of the bound, which makes it stricter (2 KB per layer and cached position here: about
// 1.2 MB a token at the mean position 72). Every dtype decodes over the same positions, as
// llama-bench's tg128 does: an 8-token prompt, then 128 steps, again (a faster dtype would
// otherwise reach longer contexts within the same seconds). Prefill is compute-bound: no
// bandwidth bound. Rows "f32 sgemm" run the tiled sgemm the GEMV replaced
// (cpu::set_gemv_enabled(false)); rows "omp" run the GEMV and cached attention as OpenMP loops (the
// path before the task pool, cpu::set_task_pool_enabled(false)), "pool" on the task pool (the
// library's path), the two taking turns. Check column: max |logit - reference| of the first decode
// step, reference = the same weights widened to f32 through the tiled sgemm (16-bit rows: bf16/f16
// values widened exactly): f32 rounding, except for Q8_0, whose GEMV multiplies 8-bit inputs
// (backend/cpu/gemv.h) and prints its check against the logits' largest magnitude too. Per dtype,
// a line gives the GEMV alone over every weight matrix of the model (one input row, one call
// each): the kernel's own read rate, apart from what a decode step adds around its calls.
#include "decode_bench.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/gemv.h"
#include "backend/cpu/task_pool.h"
#include "block_gemv_bench.h"
#include "machine.h"
#include "moe/arena.h"
#include "moe/infer/model.h"
#include "moe/io/convert.h"
#include "moe/models/transformer.h"
#include "moe/step_breakdown.h"
#include "moe/threads.h"
#include "moe/timer.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MOE_BENCH_X86 1
#endif

namespace moe::bench {
namespace {

ModelConfig bench_model(bool quick) {
  ModelConfig c;
  c.arch = Arch::mixtral;
  c.vocab_size = 256;
  c.normalize_topk = true;
  c.moe_every = 1;
  c.top_k = 2;
  c.experts = 8;
  if (quick) {
    c.layers = 2, c.d_model = 64, c.heads = 4, c.kv_heads = 2, c.d_ff = 128, c.seq = 64;
  } else {  // 144.7M parameters, 40.9M active per token
    c.layers = 8, c.d_model = 512, c.heads = 8, c.kv_heads = 4, c.d_ff = 1408, c.seq = 1024;
  }
  c.resolve();
  return c;
}

constexpr int kMaxStreams = 8;

// Sum of `streams` equal contiguous parts of p[0, n) read side by side, 16 floats of each in
// turn: several streams in flight per thread, as the GEMV reads several weight rows at once.
// One stream is a plain sequential read.
#if MOE_BENCH_X86
__attribute__((target("avx512f"))) float sum_streams_avx512(const float* p, int64_t n,
                                                            int streams) {
  __m512 acc[kMaxStreams];
  for (int s = 0; s < streams; ++s) acc[s] = _mm512_setzero_ps();
  const int64_t per = n / streams / 16 * 16;
  for (int64_t i = 0; i < per; i += 16)
    for (int s = 0; s < streams; ++s)
      acc[s] = _mm512_add_ps(acc[s], _mm512_loadu_ps(p + s * per + i));
  __m512 total = _mm512_setzero_ps();
  for (int s = 0; s < streams; ++s) total = _mm512_add_ps(total, acc[s]);
  float lane[16];
  _mm512_storeu_ps(lane, total);
  float sum = 0;
  for (float v : lane) sum += v;
  return sum;
}
#endif

float sum_streams_plain(const float* p, int64_t n, int streams) {
  float a[16] = {};
  const int64_t per = n / streams / 16 * 16;
  for (int64_t i = 0; i < per; i += 16)
    for (int s = 0; s < streams; ++s)
      for (int l = 0; l < 16; ++l) a[l] += p[s * per + i + l];
  float sum = 0;
  for (float v : a) sum += v;
  return sum;
}

// The memory-bandwidth ceiling: bytes/s of a streaming read over a buffer far beyond the caches
// (all OpenMP threads, each its contiguous share), read with 1, 4 and 8 streams per thread, the
// best of `passes` each. How many reads a thread keeps in flight decides what a host gives: on
// a 2-vCPU AMD EPYC one stream a thread read 37 GB/s where 8 read 49, so a single pattern can
// under-read the ceiling and overstate a kernel's share of it.
struct ReadBandwidth {
  std::vector<std::pair<int, double>> by_streams;  // (streams per thread, bytes/s)
  double best() const {
    double b = 0;
    for (const auto& [streams, rate] : by_streams) b = std::max(b, rate);
    return b;
  }
  std::string describe() const {
    std::string text;
    char buf[64];
    for (const auto& [streams, rate] : by_streams) {
      std::snprintf(buf, sizeof buf, "%s%d stream%s %.1f GB/s", text.empty() ? "" : ", ", streams,
                    streams == 1 ? "" : "s", rate / 1e9);
      text += buf;
    }
    return text;
  }
};

// Floats [p, p + n) a bandwidth read covers (a tensor's storage read as 4-byte words).
struct Region {
  const float* p;
  int64_t n;
};

// Each thread reads its contiguous share of the regions laid end to end, with `streams` streams
// over each piece of a region it covers. Returns the bytes read.
double read_regions(const std::vector<Region>& regions, int streams, bool wide, float& total) {
  int64_t all = 0;
  for (const Region& r : regions) all += r.n;
  double read = 0;
  float sum = 0;
#pragma omp parallel reduction(+ : sum, read)
  {
    const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t begin = all * me / threads, end = all * (me + 1) / threads;
    int64_t at = 0;  // where the current region starts in the concatenation
    for (const Region& r : regions) {
      const int64_t lo = std::max(begin, at), hi = std::min(end, at + r.n);
      if (lo < hi) {
        const float* piece = r.p + (lo - at);
        const int64_t n = hi - lo;
#if MOE_BENCH_X86
        sum += wide ? sum_streams_avx512(piece, n, streams) : sum_streams_plain(piece, n, streams);
#else
        (void)wide;
        sum += sum_streams_plain(piece, n, streams);
#endif
        read += double(n / streams / 16 * 16 * streams) * 4.0;  // what the sums covered
      }
      at += r.n;
    }
  }
  total += sum;
  return read;
}

ReadBandwidth read_bandwidth(const std::vector<Region>& regions, int passes) {
  bool wide = false;
#if MOE_BENCH_X86
  __builtin_cpu_init();
  wide = __builtin_cpu_supports("avx512f");
#endif
  ReadBandwidth out;
  volatile float sink = 0;
  for (int streams : {1, 4, kMaxStreams}) {
    double best = 0;
    for (int p = 0; p < passes; ++p) {
      float total = 0;
      Timer t;
      const double read = read_regions(regions, streams, wide, total);
      best = std::max(best, read / t.seconds());
      sink = sink + total;
    }
    out.by_streams.emplace_back(streams, best);
  }
  return out;
}

// A buffer of `bytes`, far beyond the caches, not the model's: read at the start of a run and
// again at the end (filled once, by all threads, as the weights were).
std::vector<float> fresh_buffer(size_t bytes) {
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float)) / 1024 * 1024;
  std::vector<float> buf(static_cast<size_t>(n));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = 1.0f + float(i % 7);
  return buf;
}

// The read bandwidth of a model's own parameter storage: the very pages a decode step reads. A
// host's memory need not read alike everywhere (on a VM, pages can sit on near or far host
// memory): this 2-vCPU AMD EPYC read fresh buffers at 37-47 or 58-70 GB/s from one allocation to
// the next, so a ceiling from another buffer can say little about the weights'.
ReadBandwidth weights_read_bandwidth(const ParamSet& params, int passes) {
  std::vector<Region> regions;
  for (const Param* p : params.all())
    if (p->value.defined())
      regions.push_back({static_cast<const float*>(p->value.raw()),
                         static_cast<int64_t>(p->value.nbytes() / sizeof(float))});
  return read_bandwidth(regions, passes);
}

// Weight bytes one decode step of `batch` tokens reads (see the header comment).
double step_bytes(const ParamSet& params, const ModelConfig& c, int64_t batch) {
  const double k = double(c.top_k), E = double(c.experts);
  const double touched = E * (1.0 - std::pow(1.0 - k / E, double(batch)));
  double bytes = 0;
  for (const Param* p : params.all()) {
    const double b = double(p->compute.nbytes());
    if (p->expert) {
      bytes += b / E * touched;
    } else if (p->name.rfind("embed.", 0) == 0) {
      bytes += double(batch) * b / double(p->value.dim(0));  // one row per token
    } else {
      bytes += b;
    }
  }
  return bytes;
}

struct Model {
  ModelConfig config;
  std::unique_ptr<ParamSet> params;
  std::unique_ptr<Transformer> model;
  std::map<std::string, int64_t> q8_in;  // a Q8_0 weight's `in` (its tensor holds row groups)
};

// Q8_0: the f32 model's weight matrices quantised as moe-convert quantize does. `lean`: kept as
// Q8_0 row groups (what moe-infer serves, packed as its loader packs them); otherwise their
// dequantised values in f32 (the reference).
void quantize_weights(Model& m, bool lean) {
  for (Param* p : m.params->all()) {
    if (!io::quantizable(p->name, p->value.shape())) continue;
    const int64_t in = p->value.shape().back(), rows = p->value.numel() / in;
    const int64_t row_bytes = cpu::q8_row_bytes(in);
    Shape shape = p->value.shape();
    shape.back() = row_bytes;
    Tensor q = Tensor::empty(shape, DType::u8);
    uint8_t* qs = q.data<uint8_t>();
    for (int64_t r = 0; r < rows; ++r)
      cpu::quantize_q8_0_row(p->value.data<float>() + r * in, in, qs + r * row_bytes);
    if (lean) {
      p->value = cpu::pack_q8_0(q, in);
      m.q8_in[p->name] = in;
    } else {
      for (int64_t r = 0; r < rows; ++r)
        cpu::dequantize_q8_0_row(qs + r * row_bytes, in, p->value.data<float>() + r * in);
    }
    p->refresh_compute();
  }
}

Model make_model(const ModelConfig& c, DType dtype, bool lean, bool q8 = false) {
  Model m;
  m.config = c;
  m.config.dtype = dtype;
  m.params = std::make_unique<ParamSet>(7, dtype);
  m.model = std::make_unique<Transformer>(m.config, *m.params);
  if (q8) quantize_weights(m, lean);
  if (lean) infer::lean_for_inference(*m.params);
  return m;
}

std::vector<int32_t> tokens(int64_t n, int64_t vocab, int64_t salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = int32_t((i * 37 + salt * 11) % vocab);
  return t;
}

// One forward pass through an arena reset first (as infer::generate runs them).
Tensor step(const Model& m, Arena& arena, KVCache& cache, const std::vector<int32_t>& ids,
            const std::vector<int64_t>& counts, const std::vector<int64_t>& slots) {
  arena.reset();
  ArenaScope scope(arena);
  return m.model->forward_cached(Tensor::from_vector({int64_t(ids.size())}, ids), counts, slots,
                                 cache);
}

// Decode tokens/s at `batch` over the median step (prompts of 8 tokens prefilled untimed, then
// kDecodeWindow steps, then again from a new prompt), and the logits of the first decode step.
// `parts`: the timed steps' wall time by kind of work (moe/step_breakdown.h), summed, and their
// count.
struct Profile {
  StepBreakdown parts;
  int64_t steps = 0;
};
constexpr int64_t kDecodeWindow = 128;  // steps after each prompt (llama-bench -n 128)

double decode_rate(const Model& m, int64_t batch, double min_seconds, std::vector<float>* first,
                   Profile* parts = nullptr) {
  const int64_t prompt = 8;
  KVCache cache = m.model->make_cache(batch);
  Arena arena;
  std::vector<int64_t> slots(static_cast<size_t>(batch));
  for (int64_t s = 0; s < batch; ++s) slots[static_cast<size_t>(s)] = s;
  auto refill = [&] {
    cache.clear();
    step(m, arena, cache, tokens(prompt * batch, m.config.vocab_size, 1),
         std::vector<int64_t>(static_cast<size_t>(batch), prompt), slots);
  };
  refill();
  const std::vector<int64_t> ones(static_cast<size_t>(batch), 1);
  int64_t steps = 0;
  double seconds = 0;
  std::vector<double> times;
  while (seconds < min_seconds || steps < 5) {
    if (cache.length[0] >= std::min(prompt + kDecodeWindow, m.config.seq - 1)) refill();
    const std::vector<int32_t> ids = tokens(batch, m.config.vocab_size, steps);
    StepBreakdown step_parts;
    Timer t;
    Tensor logits;
    {
      StepRecording recording(step_parts);
      logits = step(m, arena, cache, ids, ones, slots);
    }
    const double s = t.seconds();
    if (parts && steps > 0) parts->parts += step_parts, ++parts->steps;
    if (steps == 0 && first)
      first->assign(logits.data<float>(), logits.data<float>() + logits.numel());
    if (steps > 0) seconds += s, times.push_back(s);  // the first step warms arena and caches
    ++steps;
  }
  // The median step: on a shared machine one descheduled step must not move the figure.
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return double(batch) / times[times.size() / 2];
}

double prefill_rate(const Model& m, int64_t n, double min_seconds) {
  KVCache cache = m.model->make_cache(1);
  Arena arena;
  const std::vector<int32_t> ids = tokens(n, m.config.vocab_size, 3);
  double best = 0, total = 0;
  for (int r = 0; r < 2 || total < min_seconds; ++r) {
    cache.clear();
    Timer t;
    step(m, arena, cache, ids, {n}, {0});
    const double s = t.seconds();
    if (r > 0) best = std::max(best, double(n) / s), total += s;
  }
  return best;
}

// Seconds one empty OpenMP parallel region costs (fork, join) on all threads: the best mean over
// a few runs of many regions. A decode step pays it once per region it opens.
double fork_join_seconds() {
  double best = 1e9;
  for (int run = 0; run < 5; ++run) {
    const int regions = 2000;
    Timer t;
    for (int i = 0; i < regions; ++i) {
#pragma omp parallel
      {
        volatile int sink = omp_get_thread_num();
        (void)sink;
      }
    }
    best = std::min(best, t.seconds() / regions);
  }
  return best;
}

// Bytes of parameter storage the model holds: values, distinct compute copies, gradients.
double held_bytes(const ParamSet& params) {
  double bytes = 0;
  for (const Param* p : params.all()) {
    bytes += double(p->value.nbytes()) + double(p->grad.defined() ? p->grad.nbytes() : 0);
    if (p->compute.defined() && p->compute.raw() != p->value.raw())
      bytes += double(p->compute.nbytes());
  }
  return bytes;
}

// "# f32: pool batch-1 step 3.10 ms (mean of 120): gemm 2.81 ms 91% | attention ...", parts over
// 0.5% of the step, largest first.
void print_parts(const std::string& dtype, const Profile& p) {
  const double steps = double(std::max<int64_t>(p.steps, 1)), total = p.parts.total();
  std::vector<std::pair<double, int>> order;
  for (int i = 0; i < kStepParts; ++i)
    order.push_back({p.parts.seconds[static_cast<size_t>(i)], i});
  std::sort(order.rbegin(), order.rend());
  std::printf("# %s: pool batch-1 step %.3f ms (mean of %lld):", dtype.c_str(), 1e3 * total / steps,
              static_cast<long long>(p.steps));
  const char* sep = " ";
  for (const auto& [seconds, i] : order) {
    if (total <= 0 || seconds < 0.005 * total) continue;
    std::printf("%s%s %.3f ms %.0f%%", sep, step_part_name(static_cast<StepPart>(i)),
                1e3 * seconds / steps, 100 * seconds / total);
    sep = " | ";
  }
  std::printf("\n");
}

// The GEMV alone: every weight matrix of `m` (all experts, not just a step's; no embedding
// table) multiplied by one input row, one gemv_batch call per matrix, the threads the library
// uses. Bytes/s of its weights, the best of `passes` passes over all of them (each pass reads far
// more than the caches hold). Against the step's rate this separates the kernel's reading speed
// from what a step adds around it (small calls, joins, the work between them).
double gemv_alone_rate(const Model& m, int passes) {
  std::vector<cpu::WeightMatrix> matrices;
  double bytes = 0;
  for (const Param* p : m.params->all()) {
    if (p->value.ndim() < 2 || p->name.rfind("embed.", 0) == 0) continue;
    const int64_t row = p->value.shape().back(), out = p->value.dim(p->value.ndim() - 2);
    const int64_t in = p->value.dtype() == DType::q8_0 ? m.q8_in.at(p->name) : row;
    const int64_t count = p->value.numel() / (out * row);
    for (int64_t e = 0; e < count; ++e) matrices.push_back(cpu::weight_matrix(p->value, e, in));
    bytes += double(p->value.nbytes());
  }
  int64_t widest = 0;
  for (const cpu::WeightMatrix& w : matrices) widest = std::max({widest, w.in, w.out});
  std::vector<float> x(static_cast<size_t>(widest), 0.5f), y(static_cast<size_t>(widest));
  double best = 0;
  for (int pass = 0; pass < passes; ++pass) {
    Timer t;
    for (const cpu::WeightMatrix& w : matrices) {
      cpu::GemvProblem problem;
      problem.w = w;
      problem.x = x.data(), problem.ldx = w.in, problem.m = 1;
      problem.y = y.data(), problem.ldy = w.out;
      cpu::gemv_batch(&problem, 1);
    }
    best = std::max(best, bytes / t.seconds());
  }
  return best;
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
  return d;
}

}  // namespace

int run_decode(const DecodeOptions& o) {
  // Block formats (q4_k, q6_k, mxfp4) get the GEMV table alone (block_gemv_bench.h), after the
  // model rows of the other dtypes, if any.
  std::vector<std::string> dtypes, blocks;
  for (const std::string& name : o.dtypes) {  // refused before any work (UsageError: exit 2)
    if (is_block_dtype_name(name)) {
      blocks.push_back(name);
      continue;
    }
    if (name != "q8_0") parse_dtype(name);
    dtypes.push_back(name);
  }
  if (o.threads > 0) set_num_threads(o.threads);
  const int block_rounds = o.quick ? 3 : 9;
  if (dtypes.empty()) {
    run_block_gemv(blocks, o.quick, o.threads, block_rounds);
    return 0;
  }
  const ModelConfig c = bench_model(o.quick);
  const double min_s = o.quick ? std::min(o.min_seconds, 0.05) : o.min_seconds;
  const int64_t prefill = o.quick ? 32 : 512;
  const size_t read_bytes = o.quick ? size_t(64) << 20 : size_t(1) << 30;
  const int read_passes = o.quick ? 2 : 5;
  const std::vector<float> fresh = fresh_buffer(read_bytes);
  const std::vector<Region> fresh_region = {{fresh.data(), static_cast<int64_t>(fresh.size())}};
  const ReadBandwidth read = read_bandwidth(fresh_region, read_passes);
  Model f32 = make_model(c, DType::f32, true);
  double f32_prefill = 0;  // prefill rows of the other dtypes are compared with it
  int64_t total = 0, active = 0;
  for (const Param* p : f32.params->all()) {
    total += p->numel();
    active += p->expert                         ? p->numel() / c.experts * c.top_k
              : p->name.rfind("embed.", 0) == 0 ? c.d_model
                                                : p->numel();
  }
  std::printf("# moe-bench --decode: %s, %s, %d threads, load average %s\n", cpu_model().c_str(),
              now_utc().c_str(), num_threads(), load_average().c_str());
  std::printf(
      "# model: mixtral d %lld, %lld layers all MoE, heads %lld (kv %lld), F %lld, E %lld "
      "top-%lld, "
      "vocab %lld: %.1fM parameters, %.1fM active per token\n",
      (long long)c.d_model, (long long)c.layers, (long long)c.heads, (long long)c.kv_heads,
      (long long)c.d_ff, (long long)c.experts, (long long)c.top_k, (long long)c.vocab_size,
      double(total) / 1e6, double(active) / 1e6);
  std::printf(
      "# decode: an 8-token prompt, then %lld steps, repeated (every dtype at the same positions, "
      "as llama-bench -n %lld)\n",
      (long long)kDecodeWindow, (long long)kDecodeWindow);
  std::printf(
      "# read bandwidth (streaming read, %d threads, best pass of each pattern): a fresh %.0f MB "
      "buffer %.1f GB/s (%s per thread)\n",
      num_threads(), double(read_bytes) / 1e6, read.best() / 1e9, read.describe().c_str());
  std::printf(
      "# OpenMP fork/join (an empty parallel region, %d threads, best mean): %.2f us, "
      "OMP_WAIT_POLICY=%s; the library's decode path under it: %s\n",
      num_threads(), 1e6 * fork_join_seconds(),
      std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "(unset)",
      cpu::task_pool_default() ? "pool" : "omp");
  std::printf(
      "# bound = bandwidth / weight bytes a step reads (batch 8: expected experts touched); "
      "bandwidth: the larger of the fresh buffer's and the dtype's own weights' (read the same "
      "way just before its rows), so a ratio never rests on the slower pages\n");
  std::printf(
      "# paired: the median over the rounds of each round's tok/s over its own bound, from the "
      "dtype's weights read just before that round (best of 2 passes, where the bandwidth above "
      "takes the best of %d; the host's bandwidth drifts within seconds, and this pairs each rate "
      "with the bandwidth of its moment)\n",
      read_passes);
  std::printf("# %-5s %-6s %-15s %10s %10s %7s %7s %12s\n", "dtype", "path", "measure", "tok/s",
              "bound", "ratio", "paired", "max|dlogit|");

  auto row = [&](const char* dtype, const char* path, const char* measure, double rate,
                 double bound, double check, double paired = -1) {
    char b[32] = "-", r[32] = "-", pr[32] = "-", ch[32] = "-";
    if (bound > 0) std::snprintf(b, sizeof b, "%.1f", bound);
    if (bound > 0) std::snprintf(r, sizeof r, "%.2f", rate / bound);
    if (paired >= 0) std::snprintf(pr, sizeof pr, "%.2f", paired);
    if (check >= 0) std::snprintf(ch, sizeof ch, "%.2e", check);
    std::printf("  %-5s %-6s %-15s %10.1f %10s %7s %7s %12s\n", dtype, path, measure, rate, b, r,
                pr, ch);
    std::fflush(stdout);
  };

  for (const std::string& name : dtypes) {
    const bool q8 = name == "q8_0";
    const DType dtype = q8 ? DType::f32 : parse_dtype(name);
    // The reference: the same values, widened to f32 (no lean step), through the tiled sgemm.
    const Model wide = dtype == DType::f32 && !q8 ? Model{} : make_model(c, dtype, false, q8);
    const Model& ref = dtype == DType::f32 && !q8 ? f32 : wide;
    std::vector<float> expect, got;
    cpu::set_gemv_enabled(false);
    const double sgemm1 = decode_rate(ref, 1, min_s, &expect);
    const double sgemm8 = dtype == DType::f32 && !q8 ? decode_rate(ref, 8, min_s, nullptr) : 0;
    cpu::set_gemv_enabled(true);
    const Model lean_model = dtype == DType::f32 && !q8 ? Model{} : make_model(c, dtype, true, q8);
    const Model& m = dtype == DType::f32 && !q8 ? f32 : lean_model;
    const ReadBandwidth own = weights_read_bandwidth(*m.params, read_passes);
    const double bandwidth = std::max(read.best(), own.best());
    std::printf(
        "# %s: its weights (%.1f MB) read at %.1f GB/s (%s per thread); bound at %.1f GB/s\n",
        name.c_str(), held_bytes(*m.params) / 1e6, own.best() / 1e9, own.describe().c_str(),
        bandwidth / 1e9);
    if (dtype == DType::f32 && !q8) {
      row("f32", "sgemm", "decode batch 1", sgemm1, bandwidth / step_bytes(*ref.params, c, 1), -1);
      row("f32", "sgemm", "decode batch 8", sgemm8, 8 * bandwidth / step_bytes(*ref.params, c, 8),
          -1);
    }
    // The GEMV on OpenMP regions (before) and on the task pool (the library's path), taking
    // turns over three rounds (a shared machine's speed drifts); each the median of its rounds.
    Profile parts;
    std::vector<double> omp1, omp8, pool1, pool8, round_bandwidth;
    for (int round = 0; round < 3; ++round) {
      round_bandwidth.push_back(weights_read_bandwidth(*m.params, 2).best());
      cpu::set_task_pool_enabled(false);
      omp1.push_back(decode_rate(m, 1, min_s / 3, nullptr));
      omp8.push_back(decode_rate(m, 8, min_s / 3, nullptr));
      cpu::set_task_pool_enabled(true);
      pool1.push_back(decode_rate(m, 1, min_s / 3, round == 0 ? &got : nullptr, &parts));
      pool8.push_back(decode_rate(m, 8, min_s / 3, nullptr));
    }
    cpu::set_task_pool_enabled(cpu::task_pool_default());
    const double pf = prefill_rate(m, prefill, min_s);
    const double bound1 = bandwidth / step_bytes(*m.params, c, 1),
                 bound8 = 8 * bandwidth / step_bytes(*m.params, c, 8);
    // Each round's rate over the bound of its own moment's bandwidth, the median over rounds.
    auto paired = [&](const std::vector<double>& rates, int64_t batch) {
      const double bytes = step_bytes(*m.params, c, batch);
      std::vector<double> ratios;
      for (size_t r = 0; r < rates.size(); ++r)
        ratios.push_back(rates[r] * bytes / (double(batch) * round_bandwidth[r]));
      return median(ratios);
    };
    row(name.c_str(), "omp", "decode batch 1", median(omp1), bound1, -1, paired(omp1, 1));
    row(name.c_str(), "omp", "decode batch 8", median(omp8), bound8, -1, paired(omp8, 8));
    row(name.c_str(), "pool", "decode batch 1", median(pool1), bound1, max_diff(got, expect),
        paired(pool1, 1));
    row(name.c_str(), "pool", "decode batch 8", median(pool8), bound8, -1, paired(pool8, 8));
    print_parts(name, parts);
    const double before = weights_read_bandwidth(*m.params, 2).best();
    const double alone = gemv_alone_rate(m, read_passes);
    std::printf(
        "# %s: the GEMV alone (every weight matrix, one input row, one call each) read its "
        "weights at %.1f GB/s: %.2f of the bound's bandwidth, %.2f of its weights' read just "
        "before (%.1f GB/s)\n",
        name.c_str(), alone / 1e9, alone / bandwidth, alone / before, before / 1e9);
    if (q8) {  // its check is not f32 rounding: the GEMV multiplies 8-bit inputs (gemv.h)
      double largest = 0;
      for (float v : expect) largest = std::max(largest, std::fabs(double(v)));
      std::printf(
          "# q8_0: 8-bit inputs in the GEMV: check %.2e against the reference's largest "
          "|logit| %.3g (%.2f%%)\n",
          max_diff(got, expect), largest, 100 * max_diff(got, expect) / largest);
    }
    std::printf("# %s: parameter storage held %.1f MB (the same weights widened to f32: %.1f MB)\n",
                name.c_str(), held_bytes(*m.params) / 1e6, held_bytes(*ref.params) / 1e6);
    char what[32];
    std::snprintf(what, sizeof what, "prefill %lld", (long long)prefill);
    // Prefill has no bandwidth bound: its "bound" is f32's prefill in this run (ratio: vs f32).
    if (name == "f32") f32_prefill = pf;
    row(name.c_str(), "sgemm", what, pf, name == "f32" ? 0 : f32_prefill, -1);
  }
  // The host's bandwidth can move during a run: measured again, so a drift shows beside the rows'
  // bounds (which use the start's).
  const ReadBandwidth after = read_bandwidth(fresh_region, read_passes);
  std::printf("# read bandwidth at the end: a fresh buffer %.1f GB/s (%s per thread)\n",
              after.best() / 1e9, after.describe().c_str());
  std::printf("# load average %s at the end\n", load_average().c_str());
  if (!blocks.empty()) run_block_gemv(blocks, o.quick, o.threads, block_rounds);
  return 0;
}

}  // namespace moe::bench
