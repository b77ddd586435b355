// The experts' clamped SwiGLU (gpt-oss: g = min(h, limit), u = clamp(h3, -limit, limit),
// a = (u + 1) g sigmoid(alpha g)): ops::expert_activation and its backward against a double
// reference at, just inside and just outside the clamp points; gradients by central differences
// away from the kinks; the CUDA bodies on the CPU harness; every vector copy of the CPU spans;
// refused constants. Shapes: M rows of the permuted buffer, F hidden width, E experts.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/activation_rows.h"
#include "backend/cpu/vector_isa.h"
#include "backend/cuda/activation.cuh"
#include "moe/ops/moe.h"
#include "support/cuda.h"
#include "support/gradcheck.h"

using namespace moe;
namespace body = moe::cuda::body;

namespace {

struct Ref {
  double a, dh, dh3;  // the activation and its partial derivatives
};

// The formulas, in double (torch's clamp / min: the gradient passes at exactly the limit).
Ref reference(double h, double h3, double alpha, double limit) {
  const double g = std::min(h, limit), u = std::max(-limit, std::min(h3, limit));
  const double s = 1.0 / (1.0 + std::exp(-alpha * g));
  const double dh = h > limit ? 0.0 : (u + 1.0) * s * (1.0 + alpha * g * (1.0 - s));
  const double dh3 = (h3 > limit || h3 < -limit) ? 0.0 : g * s;
  return {(u + 1.0) * g * s, dh, dh3};
}

// Values of h and h3 on both sides of +-limit: exactly at it, one float step either side, a little
// and far beyond, and ordinary values; row r of the [M,F] operands takes them rotated by r.
std::vector<float> probe_values(float limit) {
  const float up = std::nextafter(limit, 2 * limit), down = std::nextafter(limit, 0.0f);
  return {limit,         -limit,     up,    -up,  down,  -down, limit + 0.25f, -limit - 0.25f,
          3 * limit,     -3 * limit, 0.0f,  0.5f, -0.5f, 1.0f,  -1.0f,         -2.0f,
          limit - 0.75f, 40.0f,      -40.0f};
}

// [M,F] filled from probe_values, rows rotated, so that every (h, h3) pair class occurs.
Tensor probe_tensor(int64_t M, int64_t F, float limit, int64_t shift) {
  const std::vector<float> v = probe_values(limit);
  std::vector<float> out(static_cast<size_t>(M * F));
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < F; ++c)
      out[r * F + c] = v[static_cast<size_t>((c + r * shift) % static_cast<int64_t>(v.size()))];
  return Tensor::from_vector({M, F}, out);
}

}  // namespace

TEST_CASE("clamped swiglu: forward and gradient equal the double formulas at the clamp points",
          "[clamped-swiglu]") {
  const SwigluClamp clamp{1.702f, 7.0f};
  const int64_t M = 19, F = 19;  // F not a multiple of the CPU's 64 lanes
  const std::vector<int32_t> offsets{0, 19};
  Tensor h = probe_tensor(M, F, clamp.limit, 1), h3 = probe_tensor(M, F, clamp.limit, 5);
  const std::vector<float> h_in = h.to_vector(), h3s = h3.to_vector();
  Tensor a = Tensor::empty({M, F}), da = test::random_tensor({M, F}, 3);
  ops::expert_activation(h, h3, Tensor(), offsets, Activation::swiglu_clamped, a, clamp);
  REQUIRE(h.to_vector() == h_in);  // no bias: h keeps the unclamped pre-activation
  Tensor dh = Tensor::empty({M, F}), dh3 = Tensor::empty({M, F});
  ops::expert_activation_backward(da, h, h3, Activation::swiglu_clamped, dh, dh3, clamp);
  const std::vector<float> as = a.to_vector(), das = da.to_vector(), d = dh.to_vector(),
                           d3 = dh3.to_vector();
  int64_t gate_clamped = 0, up_clamped = 0, at_limit = 0;
  for (int64_t i = 0; i < M * F; ++i) {
    INFO("h " << h_in[i] << " h3 " << h3s[i]);
    const Ref r = reference(h_in[i], h3s[i], clamp.alpha, clamp.limit);
    // Float rounding: sigmoid through exp_f (< 1 ulp) and a divide, then three products and the
    // (u + 1) add: a few ulps of each factor, so 1e-6 of the terms' magnitude (2^-24 = 6e-8 an
    // ulp); (u + 1) can cancel, hence the bound on |g s| (|u| + 1) rather than on |a|.
    const double g = std::min<double>(h_in[i], clamp.limit);
    const double gs = std::fabs(g / (1.0 + std::exp(-clamp.alpha * g)));
    const double u = std::max<double>(-clamp.limit, std::min<double>(h3s[i], clamp.limit));
    CHECK(std::fabs(as[i] - r.a) <= 1e-6 * gs * (std::fabs(u) + 1.0) + 1e-30);
    CHECK(std::fabs(d[i] - das[i] * r.dh) <= 1e-6 * std::fabs(das[i]) * (std::fabs(u) + 1.0));
    CHECK(std::fabs(d3[i] - das[i] * r.dh3) <= 1e-6 * std::fabs(das[i]) * gs + 1e-30);
    // Beyond a clamp the gradient is exactly zero; at exactly the limit it passes.
    if (h_in[i] > clamp.limit) {
      ++gate_clamped;
      CHECK(d[i] == 0.0f);
    }
    if (std::fabs(h3s[i]) > clamp.limit) {
      ++up_clamped;
      CHECK(d3[i] == 0.0f);
    }
    if (h_in[i] == clamp.limit && das[i] != 0.0f && r.dh != 0.0) {  // r.dh = 0 where u = -1
      ++at_limit;
      CHECK(d[i] != 0.0f);
    }
  }
  CHECK(gate_clamped > 0);
  CHECK(up_clamped > 0);
  CHECK(at_limit > 0);
  // NaN passes through the clamps, as torch's.
  Tensor hn = Tensor::from_vector({1, 2}, std::vector<float>{std::nanf(""), 1.0f});
  Tensor h3n = Tensor::from_vector({1, 2}, std::vector<float>{0.5f, std::nanf("")});
  Tensor an = Tensor::empty({1, 2});
  ops::expert_activation(hn, h3n, Tensor(), {0, 1}, Activation::swiglu_clamped, an, clamp);
  CHECK(std::isnan(an.to_vector()[0]));
  CHECK(std::isnan(an.to_vector()[1]));
}

TEST_CASE("clamped swiglu: gradients by central differences, with per-expert biases",
          "[clamped-swiglu]") {
  // A small limit so that random values fall on both sides of every clamp. Central differences
  // across a kink measure the mean of the two one-sided slopes, not either derivative, so every
  // value within 4 eps of a kink (h = limit; h3 = +-limit) is moved 0.1 further from it; the
  // kink at exactly the limit is checked against the formulas in the test above.
  const SwigluClamp clamp{1.702f, 1.25f};
  const double eps = 1e-3;
  const std::vector<int32_t> offsets{0, 5, 5, 12, 13};  // an empty and a 1-row segment
  const int64_t E = 4, M = 13, F = 9;
  Tensor bias = test::random_tensor({E, F}, 7, 0.5f);
  auto away = [&](Tensor t, const Tensor* add) {
    std::vector<float> v = t.to_vector();
    const std::vector<float> b = add ? add->to_vector() : std::vector<float>();
    for (int64_t i = 0; i < M * F; ++i) {
      int64_t e = 0;
      while (offsets[e + 1] <= i / F) ++e;
      const float shift = add ? b[e * F + i % F] : 0.0f;  // the kink is at h + bias = limit
      for (float kink : {clamp.limit, -clamp.limit})
        if (std::fabs(v[i] + shift - kink) < 4 * eps) v[i] += v[i] + shift > kink ? 0.1f : -0.1f;
    }
    return Tensor::from_vector({M, F}, v);
  };
  Tensor h0 = away(test::random_tensor({M, F}, 5, 3.0f), &bias);
  Tensor h3 = away(test::random_tensor({M, F}, 6, 3.0f), nullptr);
  Tensor r = test::random_tensor({M, F}, 8);
  auto forward = [&](Tensor& h) {
    Tensor a = Tensor::empty({M, F});
    ops::expert_activation(h, h3, bias, offsets, Activation::swiglu_clamped, a, clamp);
    return a;
  };
  Tensor h = h0.clone();
  forward(h);  // h now holds h0 + bias
  Tensor dh = Tensor::empty({M, F}), dh3 = Tensor::empty({M, F});
  ops::expert_activation_backward(r, h, h3, Activation::swiglu_clamped, dh, dh3, clamp);
  auto loss = [&] {
    Tensor hc = h0.clone();
    return test::dot(forward(hc), r);
  };
  // f32 forward values (~1e-7 relative) over 2 eps: 1e-4 of the gradient's scale; the O(eps^2)
  // truncation is smaller still. 1e-3 leaves room and still fails on a wrong factor.
  MOE_REQUIRE_GRAD(test::check_gradient(h0, dh, loss, eps, 200), 1e-3);
  MOE_REQUIRE_GRAD(test::check_gradient(h3, dh3, loss, eps, 200), 1e-3);
  // The bias gradient is the row sum of dh per expert (grouped_bias_grad), d loss / d bias.
  Tensor dbias = Tensor::zeros({E, F});
  ops::grouped_bias_grad(dh, offsets, dbias);
  MOE_REQUIRE_GRAD(test::check_gradient(bias, dbias, loss, eps, 200), 1e-3);
}

TEST_CASE("cuda harness: the clamped swiglu bodies match the CPU ops", "[cuda-harness]") {
  const SwigluClamp clamp{1.702f, 1.5f};
  const std::vector<int32_t> offsets{0, 7, 7, 20, 21};
  const int64_t E = 4, M = 21, F = 19;
  Tensor h0 = test::random_tensor({M, F}, 11, 3.0f), h3 = test::random_tensor({M, F}, 12, 3.0f);
  Tensor bias = test::random_tensor({E, F}, 13);
  Tensor da = test::random_tensor({M, F}, 14);
  for (bool with_bias : {true, false}) {
    INFO("bias " << with_bias);
    Tensor h = h0.clone(), a = Tensor::empty({M, F});
    ops::expert_activation(h, h3, with_bias ? bias : Tensor(), offsets, Activation::swiglu_clamped,
                           a, clamp);
    Tensor dh = Tensor::empty({M, F}), dh3 = Tensor::empty({M, F});
    ops::expert_activation_backward(da, h, h3, Activation::swiglu_clamped, dh, dh3, clamp);
    const std::vector<float> h3s = h3.to_vector(), bs = bias.to_vector(), das = da.to_vector();
    for (auto shape : test::kHarnessGrids) {
      std::vector<float> hs = h0.to_vector(), as(M * F, -1);
      cuda::run_grid_on_cpu<body::ClampedSwiglu>(
          shape, hs.data(), static_cast<const float*>(h3s.data()),
          with_bias ? static_cast<const float*>(bs.data()) : nullptr, offsets.data(), E, F,
          clamp.alpha, clamp.limit, as.data(), M * F);
      REQUIRE(hs == h.to_vector());
      CHECK(as == a.to_vector());  // bitwise: one kernels:: row body, exp_f on both sides
      std::vector<float> d(M * F, -1), d3(M * F, -1);
      cuda::run_grid_on_cpu<body::ClampedSwigluBackward>(
          shape, static_cast<const float*>(das.data()), static_cast<const float*>(hs.data()),
          static_cast<const float*>(h3s.data()), clamp.alpha, clamp.limit, d.data(), d3.data(),
          M * F);
      CHECK(d == dh.to_vector());
      CHECK(d3 == dh3.to_vector());
    }
  }
}

TEST_CASE("clamped swiglu: every vector copy of the CPU spans gives the same bits",
          "[clamped-swiglu]") {
  const SwigluClamp clamp{1.702f, 7.0f};
  const int64_t n = 3 * cpu::kActivationLanes + 17;  // whole blocks and a padded one
  const std::vector<float> h = test::random_tensor({n}, 21, 12.0f).to_vector(),
                           h3 = test::random_tensor({n}, 22, 12.0f).to_vector(),
                           b = test::random_tensor({n}, 23).to_vector(),
                           da = test::random_tensor({n}, 24).to_vector();
  std::vector<float> base_h(n), base_a(n), base_d(n), base_d3(n);
  cpu::bias_clamped_swiglu_span_on(cpu::VectorIsa::baseline, h.data(), h3.data(), b.data(), clamp,
                                   base_h.data(), base_a.data(), n);
  cpu::clamped_swiglu_backward_span_on(cpu::VectorIsa::baseline, base_h.data(), h3.data(),
                                       da.data(), clamp, base_d.data(), base_d3.data(), n);
  int copies = 0;
  for (cpu::VectorIsa isa : {cpu::VectorIsa::avx2, cpu::VectorIsa::avx512}) {
    if (!cpu::vector_isa_supported(isa)) continue;
    INFO(cpu::vector_isa_name(isa));
    ++copies;
    std::vector<float> hh(n), a(n), d(n), d3(n);
    cpu::bias_clamped_swiglu_span_on(isa, h.data(), h3.data(), b.data(), clamp, hh.data(), a.data(),
                                     n);
    cpu::clamped_swiglu_backward_span_on(isa, hh.data(), h3.data(), da.data(), clamp, d.data(),
                                         d3.data(), n);
    CHECK(hh == base_h);
    CHECK(a == base_a);
    CHECK(d == base_d);
    CHECK(d3 == base_d3);
  }
  if (copies == 0) WARN("no wide copy on this CPU: only the baseline ran");
}

TEST_CASE("clamped swiglu: a limit that is not a positive finite number is refused",
          "[clamped-swiglu]") {
  Tensor h = test::random_tensor({2, 3}, 1), h3 = test::random_tensor({2, 3}, 2);
  Tensor a = Tensor::empty({2, 3});
  for (float limit : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    INFO("limit " << limit);
    REQUIRE_THROWS_WITH(ops::expert_activation(h, h3, Tensor(), {0, 2}, Activation::swiglu_clamped,
                                               a, SwigluClamp{1.702f, limit}),
                        Catch::Contains("positive finite limit"));
  }
  // A missing up projection is refused by shape, in words.
  REQUIRE_THROWS_WITH(ops::expert_activation(h, Tensor::empty({2, 4}), Tensor(), {0, 2},
                                             Activation::swiglu_clamped, a),
                      Catch::Contains("expert_activation h3"));
}
