// The decode GEMV alone over block-format weights (q4_k, q6_k, mxfp4: llama.cpp's rows, decode
// against Q8_K / Q8_0 inputs; backend/cpu/gemv_blocks.h) and over Q8_0 row groups, per path:
// the scalar body and each x86 copy this CPU runs. A round times every case once, cases in turn
// (A B C .. A B C ..), so a shared host's drift spreads over all of them; each case's rate is
// the median over rounds. Rate: bytes of weights read per second (each matrix read once per
// call, the input quantised once per call inside it, as in decode). The matrices together are
// far larger than the caches. Bits: each path's outputs against the scalar path's.
#include "block_gemv_bench.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/gemv.h"
#include "backend/cpu/quant_blocks.h"
#include "machine.h"
#include "moe/rng.h"
#include "moe/threads.h"
#include "moe/timer.h"

namespace moe::bench {
namespace {

struct Path {
  cpu::GemvIsa isa;
  const char* name;
};
const Path kPaths[] = {{cpu::GemvIsa::scalar, "scalar"},
                       {cpu::GemvIsa::avx2, "avx2"},
                       {cpu::GemvIsa::avx512, "avx512"},
                       {cpu::GemvIsa::avx512_vnni, "avx512_vnni"}};

// `count` matrices [n, n] of one format, their rows copies of 64 quantised random rows (the
// reference quantisers are slow; the bytes read are what is timed).
struct Weights {
  std::string name;
  cpu::WeightFormat format;
  int64_t n = 0, row_bytes = 0, count = 0;
  std::vector<uint8_t> bytes;

  cpu::WeightMatrix matrix(int64_t k) const {
    return {format, bytes.data() + k * n * row_bytes, n, n};
  }
  double total_bytes() const { return double(bytes.size()); }
};

Weights make_weights(const std::string& name, int64_t n, int64_t count) {
  Weights w;
  w.name = name, w.n = n, w.count = count;
  constexpr int64_t kDistinct = 64;
  std::vector<float> x(static_cast<size_t>(n));
  std::vector<uint8_t> distinct;
  if (name == "q8_0") {
    w.format = cpu::WeightFormat::q8_0;
    w.row_bytes = cpu::q8_group_row_bytes(n);
    std::vector<uint8_t> rows(static_cast<size_t>(kDistinct * cpu::q8_row_bytes(n)));
    for (int64_t r = 0; r < kDistinct; ++r) {
      for (int64_t i = 0; i < n; ++i) x[size_t(i)] = 0.1f * rng_normal(r + 1, uint64_t(i));
      cpu::quantize_q8_0_row(x.data(), n, rows.data() + r * cpu::q8_row_bytes(n));
    }
    distinct.resize(static_cast<size_t>(kDistinct * w.row_bytes));  // 8 whole row groups
    cpu::pack_q8_0(rows.data(), kDistinct, n, distinct.data());
  } else {
    const cpu::BlockFormat f = cpu::parse_block_format(name);
    w.format = f == cpu::BlockFormat::q4_k   ? cpu::WeightFormat::q4_k
               : f == cpu::BlockFormat::q6_k ? cpu::WeightFormat::q6_k
                                             : cpu::WeightFormat::mxfp4;
    w.row_bytes = cpu::block_row_bytes(f, n);
    distinct.resize(static_cast<size_t>(kDistinct * w.row_bytes));
    for (int64_t r = 0; r < kDistinct; ++r) {
      for (int64_t i = 0; i < n; ++i) x[size_t(i)] = 0.02f + 0.1f * rng_normal(r + 1, uint64_t(i));
      cpu::quantize_row(f, x.data(), n, distinct.data() + r * w.row_bytes);
    }
  }
  w.bytes.resize(static_cast<size_t>(count * n * w.row_bytes));
  for (size_t at = 0; at < w.bytes.size(); at += distinct.size())
    std::memcpy(w.bytes.data() + at, distinct.data(),
                std::min(distinct.size(), w.bytes.size() - at));
  return w;
}

// One pass: a GEMV of one input row over every matrix; y [count, n].
void pass(const Weights& w, const std::vector<float>& x, std::vector<float>& y, cpu::GemvIsa isa) {
  for (int64_t k = 0; k < w.count; ++k) {
    cpu::GemvProblem p;
    p.w = w.matrix(k);
    p.x = x.data(), p.ldx = w.n, p.m = 1;
    p.y = y.data() + k * w.n, p.ldy = w.n;
    cpu::gemv_batch(&p, 1, isa);
  }
}

struct Case {
  const Weights* w;
  Path path;
  int threads;
  std::vector<double> rates;
  bool same = true;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

bool is_block_dtype_name(const std::string& name) {
  return name == "q4_k" || name == "q6_k" || name == "mxfp4";
}

void run_block_gemv(const std::vector<std::string>& formats, bool quick, int threads, int rounds) {
  const int64_t n = quick ? 512 : 4096, count = quick ? 2 : 8;
  const int many = threads > 0 ? threads : num_threads();
  std::vector<Weights> weights;
  weights.push_back(make_weights("q8_0", n, count));
  for (const std::string& f : formats) weights.push_back(make_weights(f, n, count));
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = rng_normal(99, uint64_t(i));
  std::vector<Case> cases;
  std::string copies;
  for (const Path& path : kPaths) {
    if (!cpu::gemv_isa_supported(path.isa)) continue;
    copies += std::string(copies.empty() ? "" : " ") + path.name;
    for (const Weights& w : weights) {
      // avx2 has no Q8_0 copy: it would time the scalar path again.
      if (w.format == cpu::WeightFormat::q8_0 && path.isa == cpu::GemvIsa::avx2) continue;
      for (int t : {1, many})
        if (t == 1 || many > 1) cases.push_back({&w, path, t, {}, true});
    }
  }
  // Bits: every case's outputs against the scalar path's (at its own thread count).
  std::vector<float> want(static_cast<size_t>(count * n)), got(want.size());
  for (Case& c : cases) {
    set_num_threads(1);
    pass(*c.w, x, want, cpu::GemvIsa::scalar);
    set_num_threads(c.threads);
    pass(*c.w, x, got, c.path.isa);
    c.same = std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0;
  }
  for (int r = 0; r < rounds; ++r)
    for (Case& c : cases) {
      set_num_threads(c.threads);
      pass(*c.w, x, got, c.path.isa);  // warm: the task pool, the input scratch
      Timer timer;
      pass(*c.w, x, got, c.path.isa);
      c.rates.push_back(c.w->total_bytes() / timer.seconds());
    }
  set_num_threads(many);
  std::printf("# block-format GEMV alone: %s, %s, load average %s\n", now_utc().c_str(),
              cpu_model().c_str(), load_average().c_str());
  std::printf(
      "# copies this CPU runs: %s; %lld matrices %lld x %lld per format, one input row, "
      "median of %d rounds taken in turn\n",
      copies.c_str(), (long long)count, (long long)n, (long long)n, rounds);
  std::printf("  %-6s %-12s %7s %9s %10s %9s %6s\n", "format", "path", "threads", "MB", "GB/s",
              "vs scalar", "bits");
  for (const Case& c : cases) {
    double scalar = 0;
    for (const Case& s : cases)
      if (s.w == c.w && s.threads == c.threads && s.path.isa == cpu::GemvIsa::scalar)
        scalar = median(s.rates);
    const double rate = median(c.rates);
    std::printf("  %-6s %-12s %7d %9.1f %10.2f %9.2f %6s\n", c.w->name.c_str(), c.path.name,
                c.threads, c.w->total_bytes() / 1e6, rate / 1e9, rate / scalar,
                c.same ? "same" : "DIFFER");
  }
}

}  // namespace moe::bench
