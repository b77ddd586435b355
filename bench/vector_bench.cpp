// moe-vector-bench: the CPU's vector-copy loops (backend/cpu/activation_rows.h) timed in cache on
// one thread, ns per float: the four activation spans (GELU and SwiGLU, forward and backward) and
// attention's causal softmax row and its backward, in each copy this CPU runs (baseline x86-64,
// AVX2, AVX-512), beside the plain scalar loop over glibc's tanhf / expf the copies replaced
// ("libm scalar"), against an in-cache triad over the same span measured in the same run (a pass
// that moves floats and does no math). Check column: a copy's bits against the baseline copy's;
// the libm loop's distance from them. nccl-tests-style table on stdout, or one JSON object with
// --json. Not a test: nothing asserted here (cli_moe_vector_bench_quick checks the columns).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/activation_rows.h"
#include "backend/cpu/vector_isa.h"
#include "common/cli.h"
#include "machine.h"
#include "moe/error.h"
#include "moe/rng.h"
#include "moe/threads.h"
#include "moe/timer.h"

using namespace moe;

namespace {

constexpr int64_t kMaxSpan = int64_t(1) << 24;
constexpr int64_t kMaxKeys = int64_t(1) << 12;  // a row set holds keys x keys scores, <= 2^24
constexpr uint64_t kSeed = 1234;
// A timed sample makes calls enough to last this long: the clock's own cost stays under 1%.
constexpr double kMinSampleSeconds = 20e-6;

struct Options {
  int64_t span = 4096, keys = 128;
  int threads = 1, rounds = 5;
  double min_seconds = 0.2;  // per row, over all rounds
  bool quick = false, json = false;
};

// A copy of a loop: the library's for one instruction set, or (nullopt) the libm scalar loop.
using Copy = std::optional<cpu::VectorIsa>;

// The "before": the kernels' math as plain scalar loops over glibc's tanhf and expf (this file
// keeps the default math flags, so no libmvec), the softmax sums in index order.
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
float sigmoid_libm(float x) { return 1.0f / (1.0f + ::expf(-x)); }

// Each loop on a given copy.
void bias_gelu(const Copy& copy, const float* h, const float* bias, float* h_out, float* a,
               int64_t n) {
  if (copy) return cpu::bias_gelu_span_on(*copy, h, bias, h_out, a, n);
  for (int64_t i = 0; i < n; ++i) {
    const float v = h[i] + bias[i];
    h_out[i] = v;
    a[i] = 0.5f * v * (1.0f + ::tanhf(kGeluC * (v + 0.044715f * v * v * v)));
  }
}
void gelu_backward(const Copy& copy, const float* h, const float* da, float* dh, int64_t n) {
  if (copy) return cpu::gelu_backward_span_on(*copy, h, da, dh, n);
  for (int64_t i = 0; i < n; ++i) {
    const float x = h[i], x2 = x * x, t = ::tanhf(kGeluC * (x + 0.044715f * x2 * x));
    const float du = kGeluC * (1.0f + 3.0f * 0.044715f * x2);
    dh[i] = da[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
  }
}
void bias_swiglu(const Copy& copy, const float* h1, const float* h3, const float* bias,
                 float* h1_out, float* a, int64_t n) {
  if (copy) return cpu::bias_swiglu_span_on(*copy, h1, h3, bias, h1_out, a, n);
  for (int64_t i = 0; i < n; ++i) {
    const float v = h1[i] + bias[i];
    h1_out[i] = v;
    a[i] = v * sigmoid_libm(v) * h3[i];
  }
}
void swiglu_backward(const Copy& copy, const float* h1, const float* h3, const float* da,
                     float* dh1, float* dh3, int64_t n) {
  if (copy) return cpu::swiglu_backward_span_on(*copy, h1, h3, da, dh1, dh3, n);
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid_libm(h1[i]);
    dh1[i] = da[i] * h3[i] * (s * (1.0f + h1[i] * (1.0f - s)));
    dh3[i] = da[i] * (h1[i] * s);
  }
}
void softmax(const Copy& copy, float* p, int64_t visible, int64_t keys) {
  if (copy) return cpu::causal_softmax_row_on(*copy, p, visible, keys);
  float m = p[0];
  for (int64_t j = 1; j < visible; ++j) m = std::max(m, p[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < visible; ++j) {
    p[j] = ::expf(p[j] - m);
    sum += p[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < visible; ++j) p[j] *= inv;
  std::fill(p + visible, p + keys, 0.0f);
}
void softmax_backward(const Copy& copy, const float* p, float* d, int64_t visible, int64_t keys,
                      float scale) {
  if (copy) return cpu::causal_softmax_backward_row_on(*copy, p, d, visible, keys, scale);
  float dot = 0.0f;
  for (int64_t j = 0; j < visible; ++j) dot += p[j] * d[j];
  for (int64_t j = 0; j < visible; ++j) d[j] = p[j] * (d[j] - dot) * scale;
  std::fill(d + visible, d + keys, 0.0f);
}

// The ceiling: a = b + s c, one copy per instruction set as the library builds its loops.
#define MOE_BENCH_TRIAD(suffix, target)                                       \
  target void triad_##suffix(float* __restrict a, const float* __restrict b,  \
                             const float* __restrict c, float s, int64_t n) { \
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];                   \
  }
MOE_BENCH_TRIAD(baseline, )
#if MOE_VECTOR_ISA_X86
MOE_BENCH_TRIAD(avx2, MOE_TARGET_AVX2)
MOE_BENCH_TRIAD(avx512, MOE_TARGET_AVX512)
#endif
using TriadFn = void (*)(float*, const float*, const float*, float, int64_t);
// Indexed by cpu::VectorIsa (vector_isas_supported() lists only the copies this build has).
constexpr TriadFn kTriads[] = {
    triad_baseline,
#if MOE_VECTOR_ISA_X86
    triad_avx2,
    triad_avx512,
#endif
};

std::vector<float> normal(int64_t n, const char* what) {
  std::vector<float> v(static_cast<size_t>(n));
  const uint64_t key = rng_key(kSeed, {hash_name(what)});
  for (int64_t i = 0; i < n; ++i) v[i] = rng_normal(key, static_cast<uint64_t>(i));
  return v;
}

// One loop of the table: a timed pass over its own buffers, and the outputs of one pass from the
// check input.
struct Loop {
  std::string name;
  double floats = 0;  // per pass: span elements, or the visible scores of a row set
  std::function<void(const Copy&)> pass;
  std::function<std::vector<float>(const Copy&)> outputs;
};

// Span arrays, n floats each: inputs (random normal) and two outputs.
struct Spans {
  int64_t n = 0;
  std::vector<float> h = normal(n, "h"), h3 = normal(n, "h3"), bias = normal(n, "bias"),
                     da = normal(n, "da"), out1 = std::vector<float>(n), out2 = out1;
};

// A T = keys attention head's score rows: keys rows of keys scores; row r sees keys 0..r when
// causal, all of them otherwise.
struct Rows {
  int64_t keys;
  bool causal;
  std::vector<float> scores, work, p_flat, d;
  Rows(int64_t k, bool c) : keys(k), causal(c) {
    scores = work = normal(k * k, "scores");
    d = normal(k * k, "d");
    p_flat.assign(static_cast<size_t>(k * k), 0.0f);
    // Timing input of the backward (its cost does not depend on the values): p = 1 / visible.
    for (int64_t r = 0; r < keys; ++r)
      std::fill_n(p_flat.begin() + r * keys, visible(r), 1.0f / static_cast<float>(visible(r)));
  }
  int64_t visible(int64_t r) const { return causal ? r + 1 : keys; }
  double visible_floats() const {
    const double k = static_cast<double>(keys);
    return causal ? k * (k + 1) / 2 : k * k;
  }
  void softmax_rows(const Copy& copy, float* x) const {
    for (int64_t r = 0; r < keys; ++r) softmax(copy, x + r * keys, visible(r), keys);
  }
  // Scale = visible: with p = 1 / visible a pass maps d to d - mean(d), so passes repeat on the
  // same values.
  void backward_rows(const Copy& copy, const float* p, float* d) const {
    for (int64_t r = 0; r < keys; ++r)
      softmax_backward(copy, p + r * keys, d + r * keys, visible(r), keys,
                       static_cast<float>(visible(r)));
  }
};

std::vector<Loop> make_loops(Spans& s, Rows& all, Rows& causal) {
  std::vector<Loop> loops;
  auto span = [&](const char* name, std::function<void(const Copy&)> pass) {
    loops.push_back({name, static_cast<double>(s.n), pass, [&s, pass](const Copy& copy) {
                       std::fill(s.out1.begin(), s.out1.end(), 0.0f);
                       std::fill(s.out2.begin(), s.out2.end(), 0.0f);
                       pass(copy);
                       std::vector<float> out = s.out1;
                       out.insert(out.end(), s.out2.begin(), s.out2.end());
                       return out;
                     }});
  };
  span("bias_gelu", [&s](const Copy& c) {
    bias_gelu(c, s.h.data(), s.bias.data(), s.out1.data(), s.out2.data(), s.n);
  });
  span("gelu_backward",
       [&s](const Copy& c) { gelu_backward(c, s.h.data(), s.da.data(), s.out1.data(), s.n); });
  span("bias_swiglu", [&s](const Copy& c) {
    bias_swiglu(c, s.h.data(), s.h3.data(), s.bias.data(), s.out1.data(), s.out2.data(), s.n);
  });
  span("swiglu_backward", [&s](const Copy& c) {
    swiglu_backward(c, s.h.data(), s.h3.data(), s.da.data(), s.out1.data(), s.out2.data(), s.n);
  });
  // Forward: timed in place on the previous pass's output (probabilities after the first).
  for (Rows* rows : {&all, &causal}) {
    Rows& r = *rows;
    loops.push_back({r.causal ? "softmax_causal" : "softmax", r.visible_floats(),
                     [&r](const Copy& c) { r.softmax_rows(c, r.work.data()); },
                     [&r](const Copy& c) {
                       std::vector<float> x = r.scores;
                       r.softmax_rows(c, x.data());
                       return x;
                     }});
  }
  // Backward: checked on the baseline copy's probabilities of the scores.
  for (Rows* rows : {&all, &causal}) {
    Rows& r = *rows;
    loops.push_back({r.causal ? "softmax_backward_causal" : "softmax_backward", r.visible_floats(),
                     [&r](const Copy& c) { r.backward_rows(c, r.p_flat.data(), r.d.data()); },
                     [&r](const Copy& c) {
                       std::vector<float> p = r.scores, d = normal(r.keys * r.keys, "dcheck");
                       r.softmax_rows(cpu::VectorIsa::baseline, p.data());
                       r.backward_rows(c, p.data(), d.data());
                       return d;
                     }});
  }
  return loops;
}

// One timed row; rounds interleave all of them and each keeps its best sample, so a burst of load
// from other processes does not land on one row (or the ceiling) alone.
struct Measure {
  std::string loop, copy;
  double floats = 0;
  std::function<void()> fn;
  int calls = 1;                                          // per sample
  double best = std::numeric_limits<double>::infinity();  // seconds per call
  std::string check{};
  size_t libm = 0;  // the index of the loop's libm row
  double ns_per_float() const { return best * 1e9 / floats; }
};

void run_rounds(std::vector<Measure>& measures, int rounds, double min_seconds) {
  for (Measure& m : measures) {  // warm-up, and the calls that make a sample long enough
    m.fn();
    Timer once;
    m.fn();
    m.calls = static_cast<int>(std::ceil(kMinSampleSeconds / std::max(once.seconds(), 1e-9)));
  }
  for (int r = 0; r < rounds; ++r)
    for (Measure& m : measures) {
      Timer total;
      do {
        Timer sample;
        for (int c = 0; c < m.calls; ++c) m.fn();
        m.best = std::min(m.best, sample.seconds() / m.calls);
      } while (total.seconds() < min_seconds / rounds);
    }
}

std::string check_against(const std::vector<float>& out, const std::vector<float>& base,
                          bool libm) {
  if (!libm) return std::memcmp(out.data(), base.data(), 4 * out.size()) ? "DIFFERS" : "same";
  double diff = 0, scale = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(out[i]) - base[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(base[i])));
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.2e", scale > 0 ? diff / scale : diff);
  return text;
}

int run(const Options& opt) {
  set_num_threads(opt.threads);
  const std::vector<cpu::VectorIsa> isas = cpu::vector_isas_supported();
  const int64_t n = opt.span;
  Spans spans{n};
  Rows all(opt.keys, false), causal(opt.keys, true);
  const std::vector<Loop> loops = make_loops(spans, all, causal);

  std::vector<Measure> measures;
  std::vector<Copy> copies = {std::nullopt};  // the libm row first, then the library's copies
  copies.insert(copies.end(), isas.begin(), isas.end());
  std::vector<float> ta(n), tb = normal(n, "b"), tc = normal(n, "c");
  for (cpu::VectorIsa isa : isas) {
    const TriadFn triad = kTriads[static_cast<int>(isa)];
    measures.push_back({.loop = "triad",
                        .copy = cpu::vector_isa_name(isa),
                        .floats = static_cast<double>(n),
                        .fn = [&, triad] { triad(ta.data(), tb.data(), tc.data(), 1.0001f, n); }});
  }
  const size_t first_loop = measures.size();
  for (const Loop& loop : loops) {
    const std::vector<float> base = loop.outputs(cpu::VectorIsa::baseline);
    const size_t libm = measures.size();
    for (const Copy& copy : copies) {
      Measure m{.loop = loop.name,
                .copy = copy ? cpu::vector_isa_name(*copy) : "libm scalar",
                .floats = loop.floats,
                .fn = [&loop, copy] { loop.pass(copy); },
                .libm = libm};
      if (copy && *copy == cpu::activation_isa()) m.copy += "*";
      m.check = check_against(loop.outputs(copy), base, !copy);
      measures.push_back(std::move(m));
    }
  }
  run_rounds(measures, opt.rounds, opt.min_seconds);
  double triad_ns = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < first_loop; ++i) triad_ns = std::min(triad_ns, measures[i].ns_per_float());
  const double triad_gbs = 12.0 / triad_ns;

  if (!opt.json) {
    std::printf("# moe-vector-bench: CPU vector-copy loops (backend/cpu/activation_rows.h)\n");
    std::printf("# %s, %s, %d thread(s), load average %s\n", bench::now_utc().c_str(),
                bench::cpu_model().c_str(), num_threads(), bench::load_average().c_str());
    std::string names;
    for (cpu::VectorIsa isa : isas)
      names += str(names.empty() ? "" : " ", cpu::vector_isa_name(isa));
    std::printf("# copies this CPU runs: %s; the library picks %s (activation_isa(), marked *)\n",
                names.c_str(), cpu::vector_isa_name(cpu::activation_isa()));
    const long span = static_cast<long>(n), keys = static_cast<long>(opt.keys);
    std::printf(
        "# spans: %ld floats; rows: %ld rows of %ld keys (a T = %ld head), every key visible, "
        "or in *_causal row i sees keys 0..i (floats = the visible ones)\n",
        span, keys, keys, keys);
    std::printf("# ceiling: in-cache triad a = b + s c over %ld floats:", span);
    for (size_t i = 0; i < first_loop; ++i)
      std::printf(" %s %.4f", measures[i].copy.c_str(), measures[i].ns_per_float());
    std::printf(" ns/float; best %.4f ns/float = %.1f GB/s at 12 B/float\n", triad_ns, triad_gbs);
    std::printf(
        "# time: best sample over %d interleaved rounds after a warm-up, >= %g s per row "
        "in all; triad = ns/float / the best triad's; vs libm = libm's time / the row's\n",
        opt.rounds, opt.min_seconds);
    std::printf(
        "# libm scalar: the same math as plain loops over glibc's tanhf / expf (the before)\n"
        "# input: random normal; softmax is timed in place on its last output, its backward on "
        "p = 1/visible, scale = visible (d stays as it is)\n"
        "# check on the random input (backward: p = the baseline's softmax of it): same = the "
        "baseline copy's bits; libm: max |libm - baseline| / max |baseline|\n");
    std::printf("# %23s %12s %9s %10s %10s %8s %8s %9s\n", "loop", "copy", "floats", "pass", "time",
                "triad", "vs libm", "check");
    std::printf("# %23s %12s %9s %10s %10s %8s %8s %9s\n", "", "", "", "(us)", "(ns/float)", "(x)",
                "(x)", "(bits)");
    for (size_t i = first_loop; i < measures.size(); ++i) {
      const Measure& m = measures[i];
      std::printf("  %23s %12s %9.0f %10.3f %10.4f %8.2f %8.2f %9s\n", m.loop.c_str(),
                  m.copy.c_str(), m.floats, m.best * 1e6, m.ns_per_float(),
                  m.ns_per_float() / triad_ns, measures[m.libm].best / m.best, m.check.c_str());
    }
  } else {
    nlohmann::json out = {{"benchmark", "vector-loops"},
                          {"date", bench::now_utc()},
                          {"cpu", bench::cpu_model()},
                          {"threads", num_threads()},
                          {"span", n},
                          {"keys", opt.keys},
                          {"triad_ns_per_float", triad_ns},
                          {"library_copy", cpu::vector_isa_name(cpu::activation_isa())}};
    for (size_t i = 0; i < first_loop; ++i)
      out["triad"][measures[i].copy] = measures[i].ns_per_float();
    for (size_t i = first_loop; i < measures.size(); ++i) {
      const Measure& m = measures[i];
      out["rows"].push_back({{"loop", m.loop},
                             {"copy", m.copy},
                             {"floats", m.floats},
                             {"seconds", m.best},
                             {"ns_per_float", m.ns_per_float()},
                             {"triad_ratio", m.ns_per_float() / triad_ns},
                             {"libm_ratio", measures[m.libm].best / m.best},
                             {"check", m.check}});
    }
    std::cout << out.dump(2) << "\n";
  }
  return tools::finish_stdout("moe-vector-bench");
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "CPU vector loops (GELU, SwiGLU, causal softmax): ns per float of each copy and of "
      "the libm scalar loop before, in cache, against a triad in the same run.",
      "moe-vector-bench"};
  app.add_option("--span", opt.span, "Floats in a span (default 4096)")
      ->check(tools::positive())
      ->check(CLI::Range(int64_t{1}, kMaxSpan));
  app.add_option("--keys", opt.keys,
                 "Keys in a softmax row; a row set holds keys x keys scores (default 128)")
      ->check(tools::positive())
      ->check(CLI::Range(int64_t{1}, kMaxKeys));
  app.add_flag("--quick", opt.quick, "0.01 s per row (smoke run)");
  app.add_flag("--json", opt.json, "One JSON object on stdout instead of the table");
  app.add_option("--threads", opt.threads,
                 "OpenMP threads (default 1; rows time single calls on the calling thread)")
      ->check(tools::positive())
      ->check(CLI::Range(1, tools::max_threads()));
  CLI::Option* min_time =
      app.add_option("--min-time", opt.min_seconds,
                     "Seconds each row is timed, over all rounds (default 0.2; 0.01 with --quick)")
          ->check(tools::non_negative());
  app.add_option("--rounds", opt.rounds,
                 "Interleaved rounds over all rows; each row keeps its best sample (default 5)")
      ->check(CLI::Range(1, 1000));
  return tools::run_tool("moe-vector-bench", app, argc, argv, [&] {
    if (opt.quick && !min_time->count()) opt.min_seconds = 0.01;
    return run(opt);
  });
}
