// Measurements on one process (plan/calibrate_measure.h): the library's GEMM, copies and AdamW,
// timed as the library runs them, and the SSD through a temporary file. Every rate is a median
// over repetitions after a warm-up, because the machines this runs on are shared and noisy.
#include "plan/calibrate_measure.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>

#include "moe/cuda.h"
#include "moe/error.h"
#include "moe/models/transformer.h"
#include "moe/offload/budget.h"
#include "moe/ops/core.h"
#include "moe/ops/moe.h"
#include "moe/optim/adamw.h"
#include "moe/param.h"
#include "moe/plan/layout.h"
#include "moe/plan/memory_model.h"
#include "moe/plan/step_time.h"
#include "moe/tensor.h"
#include "moe/threads.h"
#include "moe/timer.h"
#include "plan/check.h"

namespace moe::plan::measure {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double round4(double x) {
  if (!(x > 0) || !std::isfinite(x)) return x;
  const double scale = std::pow(10.0, 3 - std::floor(std::log10(x)));
  return std::round(x * scale) / scale;
}

std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  return str(round4(bytes), " ", units[u]);
}

std::string rate_text(double value, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int p = 0;
  while (value >= 1000 && p < 5) value /= 1000, ++p;
  return str(round4(value), " ", prefixes[p], unit);
}

namespace {

// A [rows, cols] f32 tensor on `device` with small non-zero values (no denormals, no zeros that
// a kernel could skip).
Tensor filled(int64_t rows, int64_t cols, Device device) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.25f + static_cast<float>(i % 61) / 64.0f;
  return Tensor::from_vector({rows, cols}, v).to(device);
}

void sync(Device device) {
  if (device.kind == Device::cuda) cuda::synchronize(device.index);
}

// Median seconds of `reps` calls of `work` after one warm-up call.
template <class F>
double median_seconds(int reps, Device device, F&& work) {
  work();
  sync(device);
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    Timer t;
    work();
    sync(device);
    times.push_back(t.seconds());
  }
  return median(times);
}

}  // namespace

Result gemm_rate(Device device, const Sizes& sizes) {
  // Square shapes, and an expert's shape (tokens x d_model times d_model x d_ff).
  struct Shape3 {
    int64_t m, k, n;
  };
  const std::vector<Shape3> shapes =
      sizes.quick
          ? std::vector<Shape3>{{128, 128, 128}, {256, 256, 256}}
          : std::vector<Shape3>{
                {512, 512, 512}, {1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 1024, 4096}};
  Result r;
  for (const Shape3& s : shapes) {
    Tensor a = filled(s.m, s.k, device), b = filled(s.k, s.n, device);
    Tensor c = Tensor::zeros({s.m, s.n}, DType::f32, device);
    const double seconds =
        median_seconds(sizes.reps(), device, [&] { ops::gemm(a, false, b, false, c); });
    const double rate = 2.0 * static_cast<double>(s.m * s.k * s.n) / seconds;
    r.value = std::max(r.value, rate);
    r.notes.push_back(str(s.m, "x", s.k, "x", s.n, ": ", rate_text(rate, "FLOP/s")));
  }
  return r;
}

Result grouped_gemm_rates(Device device, const Sizes& sizes, double dense_rate) {
  const int64_t experts = 8, d = sizes.quick ? 128 : 512, f = sizes.quick ? 256 : 1024;
  const std::vector<int32_t> segment_rows =
      sizes.quick ? std::vector<int32_t>{16, 128} : std::vector<int32_t>{16, 64, 256, 1024};
  Tensor w = filled(experts * f, d, device);
  w = w.reshape({experts, f, d});
  Result r;
  r.notes.push_back(str("grouped GEMM (ops::grouped_gemm, ", experts, " experts, ", d, " -> ", f,
                        "), by rows a segment:"));
  for (const int32_t rows : segment_rows) {
    std::vector<int32_t> offsets(experts + 1);
    for (int64_t e = 0; e <= experts; ++e) offsets[e] = static_cast<int32_t>(e * rows);
    Tensor a = filled(experts * rows, d, device);
    Tensor c = Tensor::zeros({experts * rows, f}, DType::f32, device);
    const double seconds =
        median_seconds(sizes.reps(), device, [&] { ops::grouped_gemm(a, w, true, offsets, c); });
    const double rate = 2.0 * static_cast<double>(experts * rows * d * f) / seconds;
    r.value = rate;
    r.notes.push_back(str(rows, ": ", rate_text(rate, "FLOP/s"), " (", round4(rate / dense_rate),
                          " of the f32 rate)"));
  }
  return r;
}

Result memcpy_rate(const Sizes& sizes) {
  const int64_t bytes = sizes.quick ? (int64_t{16} << 20) : (int64_t{256} << 20);
  Tensor a = filled(bytes / 4 / 1024, 1024, Device{}), b = Tensor::empty(a.shape());
  const double seconds = median_seconds(sizes.reps(), Device{}, [&] { b.copy_from(a); });
  Result r;
  r.value = static_cast<double>(bytes) / seconds;
  r.notes.push_back(
      str("copies of ", bytes_text(static_cast<double>(bytes)), ", median of ", sizes.reps()));
  return r;
}

Result host_device_rate(Device device, const Sizes& sizes) {
  const int64_t bytes = sizes.quick ? (int64_t{16} << 20) : (int64_t{256} << 20);
  Tensor host = filled(bytes / 4 / 1024, 1024, Device{});
  Tensor on_device = host.to(device);
  const double up = median_seconds(sizes.reps(), device, [&] { on_device.copy_from(host); });
  const double down = median_seconds(sizes.reps(), device, [&] { host.copy_from(on_device); });
  Result r;
  const double b = static_cast<double>(bytes);
  r.value = std::min(b / up, b / down);
  r.notes.push_back(str("copies of ", bytes_text(b), ", median of ", sizes.reps(),
                        ": host to device ", rate_text(b / up, "B/s"), ", device to host ",
                        rate_text(b / down, "B/s"), "; the slower"));
  return r;
}

Result device_memory_rate(Device device, const Sizes& sizes) {
  const int64_t bytes = sizes.quick ? (int64_t{16} << 20) : (int64_t{512} << 20);
  Tensor a = filled(bytes / 4 / 1024, 1024, device);
  Tensor b = Tensor::empty(a.shape(), DType::f32, device);
  const double seconds = median_seconds(sizes.reps(), device, [&] { b.copy_from(a); });
  Result r;
  r.value = 2.0 * static_cast<double>(bytes) / seconds;
  r.notes.push_back(str("copies of ", bytes_text(static_cast<double>(bytes)),
                        " within the device, read + write bytes, median of ", sizes.reps()));
  return r;
}

Result adamw_rate(const Sizes& sizes) {
  const int64_t params = sizes.quick ? (int64_t{1} << 20) : (int64_t{4} << 20);
  ParamSet set(1);
  Param& p = set.add("calibrate.w", {params}, Init::normal(0.02f));
  float* g = p.grad.data<float>();
  for (int64_t i = 0; i < params; ++i) g[i] = 1e-3f * static_cast<float>(i % 17 + 1);
  optim::AdamW adamw(set, optim::AdamWConfig{});
  const double seconds = median_seconds(sizes.reps(), Device{}, [&] { adamw.step(1e-4f); });
  Result r;
  r.value = static_cast<double>(params) / seconds;
  r.notes.push_back(str("optim::AdamW steps of ", params, " fp32 parameters, median of ",
                        sizes.reps(), ", ", num_threads(), " threads"));
  return r;
}

double host_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (in >> key) {
    if (key == "MemTotal:" && (in >> kib)) return kib * 1024;
    in.ignore(1 << 16, '\n');
  }
  throw Error("cannot read the host's memory size: /proc/meminfo has no MemTotal");
}

double free_disk_bytes(const std::string& dir) {
  return static_cast<double>(std::max<int64_t>(0, offload::free_bytes(dir)));
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    std::string name = line.substr(colon + 1);
    while (!name.empty() && name.front() == ' ') name.erase(name.begin());
    if (!name.empty()) return name;
  }
  return "an unknown CPU";
}

double cuda_device_bytes(int device) {
  // cuda::device_name ends "(sm_90, 79.1 GiB)": the device's total memory, to 0.1 GiB.
  const std::string name = cuda::device_name(device);
  const size_t comma = name.rfind(", "), gib = name.rfind(" GiB)");
  PLAN_CHECK(comma != std::string::npos && gib != std::string::npos && gib > comma,
             "cannot tell the memory of CUDA device ", device, " from '", name, "'");
  return std::stod(name.substr(comma + 2, gib - comma - 2)) * 1073741824.0;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

}  // namespace moe::plan::measure

namespace moe::plan::measure {

std::vector<double> nonnegative_fit(const std::vector<std::vector<double>>& X,
                                    const std::vector<double>& r) {
  const size_t n = X.empty() ? 0 : X[0].size();
  std::vector<double> best(n, 0.0);
  double best_error = 0;
  for (double v : r) best_error += v * v;  // all zero
  for (unsigned mask = 1; mask < (1u << n); ++mask) {
    std::vector<size_t> cols;
    for (size_t j = 0; j < n; ++j)
      if (mask & (1u << j)) cols.push_back(j);
    const size_t k = cols.size();
    // normal equations [X_S' X_S | X_S' r], solved by elimination with partial pivoting
    std::vector<std::vector<double>> a(k, std::vector<double>(k + 1, 0.0));
    for (size_t i = 0; i < X.size(); ++i)
      for (size_t p = 0; p < k; ++p) {
        for (size_t q = 0; q < k; ++q) a[p][q] += X[i][cols[p]] * X[i][cols[q]];
        a[p][k] += X[i][cols[p]] * r[i];
      }
    bool singular = false;
    for (size_t p = 0; p < k && !singular; ++p) {
      size_t pivot = p;
      for (size_t q = p + 1; q < k; ++q)
        if (std::fabs(a[q][p]) > std::fabs(a[pivot][p])) pivot = q;
      std::swap(a[p], a[pivot]);
      if (std::fabs(a[p][p]) < 1e-300) singular = true;
      for (size_t q = 0; q < k && !singular; ++q) {
        if (q == p) continue;
        const double f = a[q][p] / a[p][p];
        for (size_t c = p; c <= k; ++c) a[q][c] -= f * a[p][c];
      }
    }
    if (singular) continue;
    std::vector<double> coef(n, 0.0);
    bool feasible = true;
    for (size_t p = 0; p < k; ++p) {
      coef[cols[p]] = a[p][k] / a[p][p];
      feasible = feasible && coef[cols[p]] >= 0;
    }
    if (!feasible) continue;
    double error = 0;
    for (size_t i = 0; i < X.size(); ++i) {
      double e = r[i];
      for (size_t j = 0; j < n; ++j) e -= X[i][j] * coef[j];
      error += e * e;
    }
    if (error < best_error) best_error = error, best = coef;
  }
  return best;
}

namespace {

struct Shape {
  int64_t d, layers, seq, batch;
};

ModelConfig overhead_model(const Shape& s) {
  ModelConfig m;
  m.layers = s.layers;
  m.d_model = s.d;
  m.heads = 4;
  m.d_ff = 4 * s.d;
  m.experts = 4;
  m.moe_every = 1;
  m.seq = s.seq;
  m.resolve();
  return m;
}

// The step predict_step gives `config` for `tokens` on `spec`, every expert equally loaded.
double predicted_step(const ModelConfig& config, int64_t tokens, const ClusterSpec& spec) {
  StepInput in;
  in.config = config;
  in.cluster = spec;
  in.tokens_per_rank = tokens;
  std::vector<int64_t> experts;
  for (int64_t e : config.experts_per_layer)
    if (e > 0) experts.push_back(e);
  in.layout = check_layout(Layout{}, 1, experts);
  std::vector<double> even(size_t(config.experts),
                           double(tokens * config.top_k) / double(config.experts));
  in.trace.tokens = {tokens};
  in.trace.loads = {std::vector<std::vector<double>>(experts.size(), even)};
  return predict_step(in).step_s;
}

// One model's training step as the Trainer runs it (zero the gradients, forward and backward of
// a batch, AdamW), on fixed pseudo-random tokens.
struct StepRunner {
  ParamSet params;
  Transformer model;
  optim::AdamW adamw;
  Tensor ids, targets;
  StepRunner(const ModelConfig& m, int64_t batch)
      : params(1234), model(m, params), adamw(params, optim::AdamWConfig{}) {
    std::vector<int32_t> tokens(size_t(batch * (m.seq + 1)));
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int32_t& t : tokens) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      t = int32_t((x >> 33) % uint64_t(m.vocab_size));
    }
    std::vector<int32_t> in, out;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < m.seq; ++i) {
        in.push_back(tokens[size_t(b * (m.seq + 1) + i)]);
        out.push_back(tokens[size_t(b * (m.seq + 1) + i + 1)]);
      }
    ids = Tensor::from_vector({batch, m.seq}, in);
    targets = Tensor::from_vector({batch, m.seq}, out);
  }
  double step() {
    Timer t;
    params.zero_grad();
    model.forward_backward(ids, targets, nn::RouterStep{});
    adamw.step(1e-4f);
    return t.seconds();
  }
};

// Median seconds of `reps` steps of each shape after two warm-up steps, the shapes stepped in
// turn (a machine's load then falls on all of them alike).
std::vector<double> median_steps(const std::vector<Shape>& shapes, int reps) {
  std::vector<std::unique_ptr<StepRunner>> runners;
  for (const Shape& s : shapes)
    runners.push_back(std::make_unique<StepRunner>(overhead_model(s), s.batch));
  std::vector<std::vector<double>> seconds(shapes.size());
  for (int i = 0; i < reps + 2; ++i)
    for (size_t k = 0; k < runners.size(); ++k) {
      const double step = runners[k]->step();
      if (i >= 2) seconds[k].push_back(step);
    }
  std::vector<double> out;
  for (const auto& s : seconds) out.push_back(median(s));
  return out;
}

}  // namespace

Overhead step_overhead(const Sizes& sizes, const ClusterSpec& spec) {
  const std::vector<Shape> shapes =
      sizes.quick
          ? std::vector<Shape>{{32, 1, 16, 4}, {32, 3, 16, 4}, {32, 2, 16, 16}}
          : std::vector<Shape>{
                {64, 1, 32, 8}, {64, 4, 32, 8}, {64, 2, 32, 32}, {128, 2, 64, 8}, {128, 4, 64, 8}};
  ClusterSpec bare = spec;
  bare.has_overhead = false;
  std::vector<std::vector<double>> X;
  std::vector<double> r;
  std::vector<std::string> rows;
  const int reps = sizes.quick ? 3 : 9;
  const std::vector<double> steps = median_steps(shapes, reps);
  for (size_t k = 0; k < shapes.size(); ++k) {
    const Shape& s = shapes[k];
    const ModelConfig m = overhead_model(s);
    const double measured = steps[k], predicted = predicted_step(m, s.batch * s.seq, bare);
    const double bytes = double(s.batch * s.seq) * activation_bytes_per_token(m);
    // relative least squares: each row divided by its measured step
    X.push_back({1 / measured, double(s.layers) / measured, bytes / measured});
    r.push_back((measured - predicted) / measured);
    rows.push_back(str("d_model ", s.d, ", MoE layers ", s.layers, " of 4 experts, ", s.batch,
                       " x ", s.seq, " tokens: step ", round4(measured * 1e3),
                       " ms, predicted without ", "overhead ", round4(predicted * 1e3), " ms, ",
                       round4(bytes / 1048576), " MiB of saved activations"));
  }
  const std::vector<double> c = nonnegative_fit(X, r);
  Overhead o;
  o.per_step.value = c[0];
  o.per_layer.value = c[1];
  o.elementwise.value = c[2] > 0 ? 1 / c[2] : 0;
  o.per_step.notes = {
      str("training steps (Transformer::forward_backward and optim::AdamW as the "
          "Trainer runs them; gpt, ",
          num_threads(), " threads), the median of ", reps, " after 2, the models in turn:")};
  o.per_step.notes.insert(o.per_step.notes.end(), rows.begin(), rows.end());
  o.per_step.notes.push_back(
      "each step less predict_step's time for it (no [overhead]) fitted as per_step + layers x "
      "per_layer + saved activation bytes / elementwise, least squares relative to the step, "
      "coefficients >= 0");
  o.per_layer.notes = {"fitted with per_step (see there)"};
  o.elementwise.notes = {c[2] > 0 ? "fitted with per_step (see there)"
                                  : "fitted with per_step: no per-byte cost found, 0"};
  return o;
}

}  // namespace moe::plan::measure
