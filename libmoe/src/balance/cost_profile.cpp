// Start-up profiling for FlexMoE's cost model (see moe/balance/cost_profile.h): the expert GEMM
// rate, pairwise bandwidth and all-reduce rate per group size, measured on every rank and put
// together so every rank holds the same CostModel. Shape letters: R ranks, D model width, F expert
// hidden width, n probe tokens.
#include "moe/balance/cost_profile.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/json_text.h"
#include "moe/cuda.h"
#include "moe/error.h"
#include "moe/ops/moe.h"
#include "moe/rng.h"
#include "moe/timer.h"

namespace moe::balance {

namespace {

size_t idx(int64_t i) { return static_cast<size_t>(i); }

// One parameter count for every rule in the header (biases left out).
int64_t expert_parameters(const CostProfileSpec& spec) {
  return spec.d_ff * spec.d_model * (spec.gated ? 3 : 2);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A zero-length timing (a clock too coarse for a tiny probe) would make a rate infinite; a
// nanosecond is below anything the probes can take.
double at_least_1ns(double seconds) { return std::max(seconds, 1e-9); }

void wait_device(Device device) {
  if (device.kind == Device::cuda) cuda::synchronize(device.index);
}

// Random normal values (scaled), made on the host and moved to `device`: the probes need real
// numbers (never zeros or denormals, which some kernels take faster), not particular ones.
Tensor random(Shape shape, uint64_t key, float scale, Device device) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = scale * rng_normal(key, static_cast<uint64_t>(i));
  return t.to(device);
}

// ---- the expert GEMM probe -------------------------------------------------------------------

struct ExpertWeights {
  Tensor w1, w2, w3;     // [1,F,D], [1,D,F], [1,F,D] (w3 when gated)
  Tensor gw1, gw2, gw3;  // their gradients (accumulated: values do not matter, only the work)
};

// The calls of nn::Experts' forward_group + backward_group (moe/nn/experts.cpp) for one expert
// without biases, whose rows are one segment: what an expert costs per token in training.
void expert_pass(ExpertWeights& w, bool gated, const Tensor& x, const Tensor& dy) {
  const int64_t n = x.dim(0), D = x.dim(1), F = w.w1.dim(1);
  const Device device = x.device();
  const std::vector<int32_t> offsets{0, static_cast<int32_t>(n)};
  const Activation activation = gated ? Activation::swiglu : Activation::gelu;
  Tensor h = Tensor::empty({n, F}, DType::f32, device), h3, dh3;
  if (gated) {
    h3 = Tensor::empty({n, F}, DType::f32, device);
    dh3 = Tensor::empty({n, F}, DType::f32, device);
  }
  Tensor a = Tensor::empty({n, F}, DType::f32, device);
  Tensor y = Tensor::empty({n, D}, DType::f32, device);
  Tensor dh = Tensor::empty({n, F}, DType::f32, device);
  Tensor dx = Tensor::empty({n, D}, DType::f32, device);
  // forward
  ops::grouped_gemm(x, w.w1, true, offsets, h);
  if (gated) ops::grouped_gemm(x, w.w3, true, offsets, h3);
  ops::expert_activation(h, h3, Tensor(), offsets, activation, a);
  ops::grouped_gemm(a, w.w2, true, offsets, y);
  // backward
  ops::grouped_gemm_weight_grad(dy, a, offsets, w.gw2);
  ops::grouped_gemm(dy, w.w2, false, offsets, dh);
  ops::expert_activation_backward(dh, h, h3, activation, dh, dh3);
  ops::grouped_gemm_weight_grad(dh, x, offsets, w.gw1);
  ops::grouped_gemm(dh, w.w1, false, offsets, dx);
  if (gated) {
    ops::grouped_gemm_weight_grad(dh3, x, offsets, w.gw3);
    ops::grouped_gemm(dh3, w.w3, false, offsets, dx, 1.0f);
  }
}

// (tokens, tokens/s) for every probe count, in the spec's order.
std::vector<std::pair<int64_t, double>> probe_gemm(const CostProfileSpec& spec, int rank) {
  const int64_t D = spec.d_model, F = spec.d_ff;
  const Device device = spec.device;
  const uint64_t seed = rng_key(0x636f737473ull, {static_cast<uint64_t>(rank)});
  ExpertWeights w;
  w.w1 = random({1, F, D}, rng_key(seed, {1}), 0.02f, device);
  w.w2 = random({1, D, F}, rng_key(seed, {2}), 0.02f, device);
  w.gw1 = Tensor::zeros({1, F, D}, DType::f32, device);
  w.gw2 = Tensor::zeros({1, D, F}, DType::f32, device);
  if (spec.gated) {
    w.w3 = random({1, F, D}, rng_key(seed, {3}), 0.02f, device);
    w.gw3 = Tensor::zeros({1, F, D}, DType::f32, device);
  }
  std::vector<std::pair<int64_t, double>> points;
  bool warm = false;
  for (int64_t n : spec.token_counts) {
    const Tensor x = random({n, D}, rng_key(seed, {4, static_cast<uint64_t>(n)}), 1.0f, device);
    const Tensor dy = random({n, D}, rng_key(seed, {5, static_cast<uint64_t>(n)}), 1.0f, device);
    if (!warm) {  // first-call costs (BLAS thread start, page faults) belong to no probe
      expert_pass(w, spec.gated, x, dy);
      wait_device(device);
      warm = true;
    }
    std::vector<double> seconds;
    for (int i = 0; i < spec.repeats; ++i) {
      Timer timer;
      expert_pass(w, spec.gated, x, dy);
      wait_device(device);
      seconds.push_back(at_least_1ns(timer.seconds()));
    }
    points.emplace_back(n, static_cast<double>(n) / median(seconds));
  }
  return points;
}

// ---- the communication probes ----------------------------------------------------------------

// Round `round` of the circle schedule over `ranks` (padded to even with a dummy rank that stands
// for "no partner"): rank's partner, or -1. Every pair meets exactly once over the rounds.
int partner(int rank, int round, int ranks) {
  const int n = ranks + ranks % 2, m = n - 1;  // rounds = m; the last seat n-1 stays put
  int other;
  if (rank == m) {
    other = round % m;
  } else if ((rank - round + m) % m == 0) {
    other = m;
  } else {
    other = ((2 * round - rank) % m + m) % m;
  }
  return other < ranks ? other : -1;
}

// One-way seconds of a round trip of `buf` between this rank and `peer`; the lower rank sends
// first and times, the higher one echoes (and returns 0).
double round_trip(comm::Communicator& group, int peer, Tensor& send, Tensor& recv, Device device) {
  constexpr int kTag = 0x6373;
  if (group.rank() < peer) {
    Timer timer;
    comm::Request in = group.irecv(recv, peer, kTag);
    comm::Request out = group.isend(send, peer, kTag);
    out.wait();
    in.wait();
    wait_device(device);
    return at_least_1ns(timer.seconds()) / 2;
  }
  group.irecv(recv, peer, kTag).wait();
  group.isend(recv, peer, kTag).wait();
  wait_device(device);
  return 0;
}

// This rank's row of the bandwidth matrix: bytes/s to each peer it measured (it is the lower rank
// of the pair), 0 elsewhere.
std::vector<double> probe_bandwidth(comm::Communicator& group, const CostProfileSpec& spec) {
  const int R = group.size(), me = group.rank();
  std::vector<double> row(idx(R), 0.0);
  Tensor send = Tensor::zeros({spec.bandwidth_bytes}, DType::u8, spec.comm_device);
  Tensor recv = Tensor::zeros({spec.bandwidth_bytes}, DType::u8, spec.comm_device);
  const int rounds = R + R % 2 - 1;
  for (int round = 0; round < rounds; ++round) {
    const int peer = partner(me, round, R);
    if (peer < 0) continue;
    round_trip(group, peer, send, recv, spec.comm_device);  // warm-up: connection set-up
    std::vector<double> seconds;
    for (int i = 0; i < spec.repeats; ++i)
      seconds.push_back(round_trip(group, peer, send, recv, spec.comm_device));
    // The fastest try: another process taking the core only ever slows a transfer down.
    if (me < peer)
      row[idx(peer)] = static_cast<double>(spec.bandwidth_bytes) /
                       *std::min_element(seconds.begin(), seconds.end());
  }
  return row;
}

// [R+1] all-reduce rates by group size, as measured on this rank (rank 0's are the ones kept).
std::vector<double> probe_allreduce(comm::Communicator& group, const CostProfileSpec& spec,
                                    double grad_bytes) {
  const int R = group.size(), me = group.rank();
  std::vector<double> rates(idx(R) + 1, 0.0);
  const int64_t floats = std::max<int64_t>(1, static_cast<int64_t>(grad_bytes) / 4);
  Tensor buf = Tensor::zeros({floats}, DType::f32, spec.comm_device);
  for (int g = 2; g <= R; ++g) {
    std::unique_ptr<comm::Communicator> sub = group.split(me < g ? 0 : -1, me);
    if (!sub) continue;
    sub->all_reduce(buf, comm::ReduceOp::sum);  // warm-up: the new communicator's set-up
    wait_device(spec.comm_device);
    std::vector<double> seconds;
    for (int i = 0; i < spec.repeats; ++i) {
      sub->barrier();
      Timer timer;
      sub->all_reduce(buf, comm::ReduceOp::sum);
      wait_device(spec.comm_device);
      seconds.push_back(at_least_1ns(timer.seconds()));
    }
    rates[idx(g)] = static_cast<double>(floats * 4) /  // the fastest try, as above
                    *std::min_element(seconds.begin(), seconds.end());
  }
  return rates;
}

std::string spec_text(const CostProfileSpec& s) {
  std::string counts;
  for (int64_t n : s.token_counts) counts += str(n, ",");
  return str("d_model=", s.d_model, " d_ff=", s.d_ff, " gated=", s.gated,
             " dtype_bytes=", s.dtype_bytes, " token_counts=", counts,
             " bandwidth_bytes=", s.bandwidth_bytes, " repeats=", s.repeats,
             " device=", s.device.str(), " comm_device=", s.comm_device.str());
}

}  // namespace

void CostProfileSpec::validate() const {
  MOE_USAGE_CHECK(d_model > 0, "cost profile: d_model must be positive (got ", d_model, ")");
  MOE_USAGE_CHECK(d_ff > 0, "cost profile: d_ff must be positive (got ", d_ff, ")");
  MOE_USAGE_CHECK(dtype_bytes > 0 && dtype_bytes <= 8,
                  "cost profile: dtype_bytes must be 1..8 (got ", dtype_bytes, ")");
  MOE_USAGE_CHECK(!token_counts.empty(),
                  "cost profile: token_counts is empty (give at least one GEMM probe size)");
  for (int64_t n : token_counts)
    MOE_USAGE_CHECK(n >= 1 && n <= INT32_MAX, "cost profile: token_counts holds ", n,
                    " (every probe needs 1 .. 2^31-1 tokens)");
  MOE_USAGE_CHECK(bandwidth_bytes > 0, "cost profile: bandwidth_bytes must be positive (got ",
                  bandwidth_bytes, ")");
  MOE_USAGE_CHECK(repeats >= 1, "cost profile: repeats must be >= 1 (got ", repeats, ")");
}

CostProfile profile_costs(comm::Communicator* group, const CostProfileSpec& spec) {
  Timer total;
  const bool distributed = group != nullptr && group->size() > 1;
  // Before anything else, so that every rank throws the same error instead of some ranks waiting
  // in a probe that the others never join.
  if (distributed) group->check_same_everywhere("cost profile spec", spec_text(spec));
  spec.validate();
  const int R = distributed ? group->size() : 1;
  const int me = distributed ? group->rank() : 0;

  CostProfile out;
  CostModel& m = out.model;
  const auto params = static_cast<double>(expert_parameters(spec));
  m.bytes_per_token = static_cast<double>(spec.d_model * spec.dtype_bytes);
  m.grad_bytes_per_expert = params * 4;
  m.state_bytes_per_expert = params * 12;

  out.gemm_points = probe_gemm(spec, me);
  // The rate at the largest probe (the first of equal ones).
  auto largest = std::max_element(out.gemm_points.begin(), out.gemm_points.end(),
                                  [](const auto& a, const auto& b) { return a.first < b.first; });
  const double my_rate = largest->second;

  if (!distributed) {
    m.gemm_tokens_per_s = {my_rate};
    m.bandwidth = {0.0};
    m.allreduce_bytes_per_s = {0.0, 0.0};
  } else {
    group->barrier();  // the communication probes start together, after every rank's GEMMs
    const std::vector<double> row = probe_bandwidth(*group, spec);
    const std::vector<double> allreduce = probe_allreduce(*group, spec, m.grad_bytes_per_expert);
    // One all-gather of every rank's numbers as their bit patterns: [rate, row (R), allreduce
    // (R+1)] per rank; every rank then reads the same bits in the same order.
    const int64_t width = 1 + R + (R + 1);
    Tensor mine = Tensor::empty({width}, DType::i64);
    int64_t* p = mine.data<int64_t>();
    p[0] = std::bit_cast<int64_t>(my_rate);
    for (int b = 0; b < R; ++b) p[1 + b] = std::bit_cast<int64_t>(row[idx(b)]);
    for (int g = 0; g <= R; ++g) p[1 + R + g] = std::bit_cast<int64_t>(allreduce[idx(g)]);
    Tensor all = Tensor::empty({width * R}, DType::i64);
    group->all_gather(mine, all);
    const int64_t* q = all.data<int64_t>();
    auto at = [&](int rank, int64_t i) { return std::bit_cast<double>(q[rank * width + i]); };
    m.gemm_tokens_per_s.resize(idx(R));
    m.bandwidth.assign(idx(R) * idx(R), 0.0);
    for (int a = 0; a < R; ++a) {
      m.gemm_tokens_per_s[idx(a)] = at(a, 0);
      for (int b = a + 1; b < R; ++b)  // measured by the lower rank a, the same both ways
        m.bandwidth[idx(a) * idx(R) + idx(b)] = m.bandwidth[idx(b) * idx(R) + idx(a)] =
            at(a, 1 + b);
    }
    m.allreduce_bytes_per_s.resize(idx(R) + 1);
    for (int g = 0; g <= R; ++g) m.allreduce_bytes_per_s[idx(g)] = at(0, 1 + R + g);
  }
  m.validate(R);
  out.seconds = total.seconds();
  return out;
}

// ---- reporting --------------------------------------------------------------------------------

namespace {

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace

std::string describe(const CostModel& m) {
  const size_t R = m.gemm_tokens_per_s.size();
  std::string s = str("cost model over ", R, R == 1 ? " rank" : " ranks", ":\n");
  s += "  expert GEMM fwd+bwd, tokens/s by rank:";
  for (double rate : m.gemm_tokens_per_s) s += fmt(" %.4g", rate);
  if (R > 1 && m.bandwidth.size() == R * R) {
    s += "\n  bandwidth GB/s (row: from rank, column: to rank):";
    for (size_t a = 0; a < R; ++a) {
      s += str("\n    rank ", a, ":");
      for (size_t b = 0; b < R; ++b)
        s += a == b ? std::string("        -") : fmt(" %8.3f", m.bandwidth[a * R + b] / 1e9);
    }
  }
  s += "\n  all-reduce GB/s by replica group size:";
  if (R < 2) s += " none (one rank)";
  for (size_t g = 2; g < m.allreduce_bytes_per_s.size(); ++g)
    s += str(" ", g, ": ", fmt("%.3f", m.allreduce_bytes_per_s[g] / 1e9));
  s += str("\n  bytes: per token ", fmt("%.0f", m.bytes_per_token), ", expert gradients ",
           fmt("%.0f", m.grad_bytes_per_expert), ", expert state ",
           fmt("%.0f", m.state_bytes_per_expert));
  return s;
}

nlohmann::json to_json(const CostModel& m) {
  const size_t R = m.gemm_tokens_per_s.size();
  nlohmann::json bandwidth = nlohmann::json::array();
  for (size_t a = 0; a < R && m.bandwidth.size() == R * R; ++a)
    bandwidth.push_back(std::vector<double>(m.bandwidth.begin() + static_cast<int64_t>(a * R),
                                            m.bandwidth.begin() + static_cast<int64_t>(a * R + R)));
  return {{"ranks", R},
          {"gemm_tokens_per_s", m.gemm_tokens_per_s},
          {"bandwidth_bytes_per_s", bandwidth},
          {"allreduce_bytes_per_s", m.allreduce_bytes_per_s},
          {"bytes_per_token", m.bytes_per_token},
          {"grad_bytes_per_expert", m.grad_bytes_per_expert},
          {"state_bytes_per_expert", m.state_bytes_per_expert}};
}

CostModel cost_model_from_json(const nlohmann::json& j) {
  // A value of the wrong type is named by its key, checked against what to_json writes for one
  // rank (so that the lists' elements are compared too).
  CostModel one_rank;
  one_rank.gemm_tokens_per_s = one_rank.bandwidth = one_rank.allreduce_bytes_per_s = {0.0};
  const std::string wrong = json_type_mismatch(j, to_json(one_rank));
  if (!wrong.empty()) throw Error(str("cost model: ", wrong));
  try {
    CostModel m;
    m.gemm_tokens_per_s = j.at("gemm_tokens_per_s").get<std::vector<double>>();
    for (const nlohmann::json& row : j.at("bandwidth_bytes_per_s")) {
      const std::vector<double> r = row.get<std::vector<double>>();
      m.bandwidth.insert(m.bandwidth.end(), r.begin(), r.end());
    }
    m.allreduce_bytes_per_s = j.at("allreduce_bytes_per_s").get<std::vector<double>>();
    m.bytes_per_token = j.at("bytes_per_token").get<double>();
    m.grad_bytes_per_expert = j.at("grad_bytes_per_expert").get<double>();
    m.state_bytes_per_expert = j.at("state_bytes_per_expert").get<double>();
    return m;
  } catch (const nlohmann::json::exception& e) {
    throw Error(str("cost model: ", json_error_words(e)));
  }
}

nlohmann::json to_json(const CostProfile& profile) {
  nlohmann::json j = to_json(profile.model);
  nlohmann::json points = nlohmann::json::array();
  for (const auto& [tokens, rate] : profile.gemm_points) points.push_back({tokens, rate});
  j["gemm_points"] = points;
  j["seconds"] = profile.seconds;
  return j;
}

}  // namespace moe::balance
