// The CPU activation spans (backend/cpu/activation_rows.h) and GELU's tanh (kernels::tanh_f): its
// accuracy; the AVX2 and AVX-512 copies of the GELU spans give the baseline copy's bits; the dense
// activation ops give every element the spans' bits whatever the thread count and the tensor's
// length (a plain OpenMP loop sent the elements at the end of a thread's chunk through libm's
// scalar expf / tanhf, whose bits differ from libmvec's vector ones).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/activation_rows.h"
#include "kernels/activations.h"
#include "moe/error.h"
#include "moe/ops/dense.h"
#include "support/bits.h"
#include "support/gradcheck.h"

using namespace moe;

namespace {

uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

float float_of(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

struct IsaGuard {
  cpu::ActivationIsa before = cpu::activation_isa();
  ~IsaGuard() { cpu::set_activation_isa(before); }
};

// Runs of 65,536 consecutive bit patterns; taking every 32nd or 64th covers all signs and
// exponents.
constexpr int64_t kRun = int64_t(1) << 16, kRuns = (int64_t(1) << 32) / kRun;

}  // namespace

TEST_CASE("activation spans: tanh_f is within 1.5 ulp of tanh, and exact at the edges",
          "[activation]") {
  double worst = 0;
  uint32_t worst_bits = 0;
  for (int64_t run = 0; run < kRuns; run += 64)
    for (int64_t i = 0; i < kRun; ++i) {
      const uint32_t bits = static_cast<uint32_t>(run * kRun + i);
      const float x = float_of(bits);
      if (std::isnan(x)) continue;
      const double want = std::tanh(static_cast<double>(x));
      const float rounded = static_cast<float>(want);
      // One ulp of the correctly rounded result (the smallest subnormal at 0).
      const double ulp = rounded == 0.0f ? 0x1p-149 : std::ldexp(1.0, std::ilogb(rounded) - 23);
      const double err = std::fabs(kernels::tanh_f(x) - want) / ulp;
      if (err > worst) {
        worst = err;
        worst_bits = bits;
      }
    }
  INFO("worst " << worst << " ulp at bits 0x" << std::hex << worst_bits);
  CHECK(worst <= 1.5);
  CHECK(kernels::tanh_f(0.0f) == 0.0f);
  CHECK(std::signbit(kernels::tanh_f(-0.0f)));
  CHECK(kernels::tanh_f(INFINITY) == 1.0f);
  CHECK(kernels::tanh_f(-INFINITY) == -1.0f);
  CHECK(kernels::tanh_f(20.0f) == 1.0f);
  CHECK(std::isnan(kernels::tanh_f(NAN)));
  CHECK(kernels::tanh_f(1e-30f) == 1e-30f);
  CHECK(kernels::tanh_f(-0.3f) == -kernels::tanh_f(0.3f));
}

TEST_CASE("activation spans: the CPU picks its widest GELU copy and refuses one it lacks",
          "[activation]") {
  using cpu::ActivationIsa;
  IsaGuard guard;
  REQUIRE(cpu::activation_isa_supported(ActivationIsa::baseline));
  const ActivationIsa widest =
      cpu::activation_isa_supported(ActivationIsa::avx512) ? ActivationIsa::avx512
      : cpu::activation_isa_supported(ActivationIsa::avx2) ? ActivationIsa::avx2
                                                           : ActivationIsa::baseline;
  CHECK(cpu::activation_isa() == widest);
  for (ActivationIsa isa : {ActivationIsa::avx2, ActivationIsa::avx512})
    if (!cpu::activation_isa_supported(isa)) {
      INFO(cpu::activation_isa_name(isa));
      CHECK_THROWS_AS(cpu::set_activation_isa(isa), UsageError);
      float x = 1.0f, y = 0.0f;
      CHECK_THROWS_AS(cpu::bias_gelu_span_on(isa, &x, nullptr, nullptr, &y, 1), UsageError);
    }
  cpu::set_activation_isa(ActivationIsa::baseline);
  CHECK(cpu::activation_isa() == ActivationIsa::baseline);
}

// The copies run the same IEEE operations lane by lane, so they must agree bit for bit (NaN
// payloads too); a compiler that fused, reordered or approximated in one copy would show here.
TEST_CASE("activation spans: every GELU copy this CPU has gives the baseline copy's bits",
          "[activation]") {
  using cpu::ActivationIsa;
  std::vector<ActivationIsa> wide;
  for (ActivationIsa isa : {ActivationIsa::avx2, ActivationIsa::avx512})
    if (cpu::activation_isa_supported(isa)) wide.push_back(isa);
  if (wide.empty()) {
    WARN("only the baseline copy on this CPU: nothing to compare");
    return;
  }
  std::vector<float> x(kRun), da(kRun), bias(kRun), got(kRun), h_got(kRun);
  std::vector<float> base(kRun), base_biased(kRun), base_h(kRun), base_backward(kRun);
  for (int64_t i = 0; i < kRun; ++i) {
    da[i] = 1.0f + static_cast<float>(i % 7) * 0.25f;
    bias[i] = static_cast<float>(i % 13) * 0.125f - 0.75f;
  }
  std::vector<int64_t> forward(wide.size()), with_bias(wide.size()), backward(wide.size());
  for (int64_t run = 0; run < kRuns; run += 32) {
    for (int64_t i = 0; i < kRun; ++i) x[i] = float_of(static_cast<uint32_t>(run * kRun + i));
    const auto baseline = ActivationIsa::baseline;
    cpu::bias_gelu_span_on(baseline, x.data(), nullptr, nullptr, base.data(), kRun);
    cpu::bias_gelu_span_on(baseline, x.data(), bias.data(), base_h.data(), base_biased.data(),
                           kRun);
    cpu::gelu_backward_span_on(baseline, x.data(), da.data(), base_backward.data(), kRun);
    for (size_t w = 0; w < wide.size(); ++w) {
      cpu::bias_gelu_span_on(wide[w], x.data(), nullptr, nullptr, got.data(), kRun);
      forward[w] += std::memcmp(base.data(), got.data(), kRun * 4) != 0;
      cpu::bias_gelu_span_on(wide[w], x.data(), bias.data(), h_got.data(), got.data(), kRun);
      with_bias[w] += std::memcmp(base_biased.data(), got.data(), kRun * 4) != 0 ||
                      std::memcmp(base_h.data(), h_got.data(), kRun * 4) != 0;
      cpu::gelu_backward_span_on(wide[w], x.data(), da.data(), got.data(), kRun);
      backward[w] += std::memcmp(base_backward.data(), got.data(), kRun * 4) != 0;
    }
  }
  for (size_t w = 0; w < wide.size(); ++w) {
    INFO(cpu::activation_isa_name(wide[w]) << ": runs that differ");
    CHECK(forward[w] == 0);
    CHECK(with_bias[w] == 0);
    CHECK(backward[w] == 0);
  }
}

// The inputs: values whose GELU (or SiLU) through libm's scalar function differs from the spans'
// (found here, on this libm; the random ones where none is found), repeated over an odd length.
// Run at 1 to 4 threads, the dense ops must give each element the spans' bits: with a plain loop
// the elements at the end of a thread's chunk went through the scalar function.
TEST_CASE("dense: gelu and swiglu give every element the spans' bits at any thread count",
          "[activation][dense]") {
  test::ThreadGuard threads_guard;
  const int64_t n = 100003;
  Tensor random = test::random_tensor({n}, 21, 3.0f);
  const float* r = random.data<float>();
  std::vector<float> gelu_values, silu_values;
  std::vector<float> span(n);
  cpu::bias_gelu_span(r, nullptr, nullptr, span.data(), n);
  for (int64_t i = 0; i < n && gelu_values.size() < 64; ++i)
    if (bits_of(kernels::gelu_tanh(r[i])) != bits_of(span[i])) gelu_values.push_back(r[i]);
  std::vector<float> ones(n, 1.0f);
  cpu::bias_swiglu_span(r, ones.data(), nullptr, nullptr, span.data(), n);
  for (int64_t i = 0; i < n && silu_values.size() < 64; ++i)
    if (bits_of(kernels::silu(r[i])) != bits_of(span[i])) silu_values.push_back(r[i]);
  INFO("values whose scalar GELU / SiLU differ from the spans': " << gelu_values.size() << " / "
                                                                  << silu_values.size());
  if (gelu_values.empty() || silu_values.empty())
    WARN(
        "libm's scalar GELU or SiLU agrees with the spans on these inputs: the check below cannot "
        "tell a plain loop from the spans on this host");
  auto filled = [&](const std::vector<float>& values, uint64_t seed) {
    Tensor t = test::random_tensor({n}, seed, 3.0f);
    if (!values.empty())
      for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = values[i % values.size()];
    return t;
  };
  const Tensor x = filled(gelu_values, 22), gate = filled(silu_values, 23);
  const Tensor up = test::random_tensor({n}, 24), dy = test::random_tensor({n}, 25);
  // The spans over the whole tensor, on one thread.
  Tensor gelu_want = Tensor::empty({n}), dgelu_want = Tensor::empty({n});
  Tensor swiglu_want = Tensor::empty({n}), dgate_want = Tensor::empty({n}),
         dup_want = Tensor::empty({n});
  cpu::bias_gelu_span(x.data<float>(), nullptr, nullptr, gelu_want.data<float>(), n);
  cpu::gelu_backward_span(x.data<float>(), dy.data<float>(), dgelu_want.data<float>(), n);
  cpu::bias_swiglu_span(gate.data<float>(), up.data<float>(), nullptr, nullptr,
                        swiglu_want.data<float>(), n);
  cpu::swiglu_backward_span(gate.data<float>(), up.data<float>(), dy.data<float>(),
                            dgate_want.data<float>(), dup_want.data<float>(), n);
  for (int threads = 1; threads <= 4; ++threads) {
    INFO("threads " << threads);
    set_num_threads(threads);
    Tensor g = Tensor::empty({n}), dx = Tensor::empty({n}), sw = Tensor::empty({n}),
           dgate = Tensor::empty({n}), dup = Tensor::empty({n});
    ops::gelu_forward(x, g);
    ops::gelu_backward(dy, x, dx);
    ops::swiglu_forward(gate, up, sw);
    ops::swiglu_backward(dy, gate, up, dgate, dup);
    CHECK(test::bitwise_equal(g, gelu_want));
    CHECK(test::bitwise_equal(dx, dgelu_want));
    CHECK(test::bitwise_equal(sw, swiglu_want));
    CHECK(test::bitwise_equal(dgate, dgate_want));
    CHECK(test::bitwise_equal(dup, dup_want));
    // In place, as the MLP's backward calls it (dy and dx one tensor).
    Tensor in_place = dy.clone();
    ops::gelu_backward(in_place, x, in_place);
    CHECK(test::bitwise_equal(in_place, dgelu_want));
  }
}
