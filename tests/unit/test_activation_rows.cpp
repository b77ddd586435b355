// The CPU activation spans (backend/cpu/activation_rows.h) and their math (kernels::exp_f,
// kernels::tanh_f): its accuracy; the AVX2 and AVX-512 copies of the spans give the baseline
// copy's bits; the dense activation ops give every element the scalar kernel body's bits whatever
// the thread count and the tensor's length (plain OpenMP loops once sent the elements at the end
// of a thread's chunk through libm's scalar expf / tanhf, whose bits differ from libmvec's vector
// ones).
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

float float_of(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

struct IsaGuard {
  cpu::VectorIsa before = cpu::activation_isa();
  ~IsaGuard() { cpu::set_activation_isa(before); }
};

// Runs of 65,536 consecutive bit patterns; taking every 64th covers all signs and exponents.
constexpr int64_t kRun = int64_t(1) << 16, kRuns = (int64_t(1) << 32) / kRun;

// The worst error of f against `exact` (in double) over every 64th run, in ulp of the correctly
// rounded result (the subnormals' spacing below 2^-126); results that round to infinity must be
// infinite. NaN inputs are skipped (checked apart).
template <class F, class Exact>
double worst_ulp(F f, Exact exact, uint32_t& worst_bits) {
  double worst = 0;
  for (int64_t run = 0; run < kRuns; run += 64)
    for (int64_t i = 0; i < kRun; ++i) {
      const uint32_t bits = static_cast<uint32_t>(run * kRun + i);
      const float x = float_of(bits);
      if (std::isnan(x)) continue;
      const double want = exact(static_cast<double>(x));
      const float rounded = static_cast<float>(want), got = f(x);
      double err;
      if (std::isinf(rounded)) {
        err = got == rounded ? 0.0 : 1e9;
      } else {
        const int e = rounded == 0.0f ? -126 : std::max(std::ilogb(rounded), -126);
        err = std::fabs(static_cast<double>(got) - want) / std::ldexp(1.0, e - 23);
      }
      if (err > worst) {
        worst = err;
        worst_bits = bits;
      }
    }
  return worst;
}

// kRun floats: the same bits, or both NaN.
bool same_bits_or_nans(const float* a, const float* b) {
  for (int64_t i = 0; i < kRun; ++i)
    if (std::memcmp(a + i, b + i, 4) != 0 && !(std::isnan(a[i]) && std::isnan(b[i]))) return false;
  return true;
}

}  // namespace

TEST_CASE("activation spans: exp_f within 1 ulp of exp, tanh_f within 1.5 of tanh, edges exact",
          "[activation]") {
  uint32_t at = 0;
  const double exp_worst = worst_ulp(
      kernels::exp_f, [](double x) { return std::exp(x); }, at);
  INFO("exp_f: worst " << exp_worst << " ulp at bits 0x" << std::hex << at);
  CHECK(exp_worst <= 1.0);  // 0.99 over all floats
  const double tanh_worst = worst_ulp(
      kernels::tanh_f, [](double x) { return std::tanh(x); }, at);
  INFO("tanh_f: worst " << tanh_worst << " ulp at bits 0x" << std::hex << at);
  CHECK(tanh_worst <= 1.5);  // 1.46 over all floats
  CHECK(kernels::exp_f(0.0f) == 1.0f);
  CHECK(kernels::exp_f(-INFINITY) == 0.0f);
  CHECK(kernels::exp_f(INFINITY) == INFINITY);
  CHECK(kernels::exp_f(89.0f) == INFINITY);
  CHECK(kernels::exp_f(-200.0f) == 0.0f);
  CHECK(std::isnan(kernels::exp_f(NAN)));
  CHECK(std::fpclassify(kernels::exp_f(-100.0f)) == FP_SUBNORMAL);
  CHECK(kernels::tanh_f(0.0f) == 0.0f);
  CHECK(std::signbit(kernels::tanh_f(-0.0f)));
  CHECK(kernels::tanh_f(INFINITY) == 1.0f);
  CHECK(kernels::tanh_f(-INFINITY) == -1.0f);
  CHECK(kernels::tanh_f(20.0f) == 1.0f);
  CHECK(std::isnan(kernels::tanh_f(NAN)));
  CHECK(kernels::tanh_f(1e-30f) == 1e-30f);
  CHECK(kernels::tanh_f(-0.3f) == -kernels::tanh_f(0.3f));
}

TEST_CASE("activation spans: the CPU picks its widest copy and refuses one it lacks",
          "[activation]") {
  using cpu::VectorIsa;
  IsaGuard guard;
  REQUIRE(cpu::vector_isa_supported(VectorIsa::baseline));
  const VectorIsa widest = cpu::vector_isa_supported(VectorIsa::avx512) ? VectorIsa::avx512
                           : cpu::vector_isa_supported(VectorIsa::avx2) ? VectorIsa::avx2
                                                                        : VectorIsa::baseline;
  CHECK(cpu::activation_isa() == widest);
  for (VectorIsa isa : {VectorIsa::avx2, VectorIsa::avx512})
    if (!cpu::vector_isa_supported(isa)) {
      INFO(cpu::vector_isa_name(isa));
      CHECK_THROWS_AS(cpu::set_activation_isa(isa), UsageError);
      float x = 1.0f, y = 0.0f;
      CHECK_THROWS_AS(cpu::bias_gelu_span_on(isa, &x, nullptr, nullptr, &y, 1), UsageError);
    }
  cpu::set_activation_isa(VectorIsa::baseline);
  CHECK(cpu::activation_isa() == VectorIsa::baseline);
}

// The copies run the same IEEE operations lane by lane, so they must agree bit for bit; a
// compiler that fused, reordered or approximated in one copy would show here. NaN results need
// only be NaN: where both operands of a product are NaN, x86 returns the first one, and the
// vectoriser may order a commutative product's operands differently at each width (SiLU's
// x * sigmoid(x) on a NaN x: the sigmoid's NaN has the sign flipped).
// Every 64th run of bit patterns (1/64 of all floats) through each span: GELU and SwiGLU forward
// with and without a bias (the pre-activation written back), and both backwards.
TEST_CASE("activation spans: every copy this CPU has gives the baseline copy's bits",
          "[activation]") {
  using cpu::VectorIsa;
  std::vector<VectorIsa> wide;
  for (VectorIsa isa : {VectorIsa::avx2, VectorIsa::avx512})
    if (cpu::vector_isa_supported(isa)) wide.push_back(isa);
  if (wide.empty()) {
    WARN("only the baseline copy on this CPU: nothing to compare");
    return;
  }
  // Each span on one copy, its outputs appended to `out`.
  std::vector<float> x(kRun), other(kRun), bias(kRun);
  for (int64_t i = 0; i < kRun; ++i) {
    other[i] = 1.0f + static_cast<float>(i % 7) * 0.25f;  // da, or h3
    bias[i] = static_cast<float>(i % 13) * 0.125f - 0.75f;
  }
  auto run_all = [&](VectorIsa isa, std::vector<float>& out) {
    out.assign(10 * kRun, 0.0f);
    float* o = out.data();
    cpu::bias_gelu_span_on(isa, x.data(), nullptr, nullptr, o, kRun);
    cpu::bias_gelu_span_on(isa, x.data(), bias.data(), o + kRun, o + 2 * kRun, kRun);
    cpu::gelu_backward_span_on(isa, x.data(), other.data(), o + 3 * kRun, kRun);
    cpu::bias_swiglu_span_on(isa, x.data(), other.data(), nullptr, nullptr, o + 4 * kRun, kRun);
    cpu::bias_swiglu_span_on(isa, x.data(), other.data(), bias.data(), o + 5 * kRun, o + 6 * kRun,
                             kRun);
    cpu::swiglu_backward_span_on(isa, x.data(), other.data(), bias.data(), o + 7 * kRun,
                                 o + 8 * kRun, kRun);
    cpu::gelu_backward_span_on(isa, other.data(), x.data(), o + 9 * kRun, kRun);  // da = x
  };
  std::vector<float> base, got;
  std::vector<std::vector<int64_t>> differ(wide.size(), std::vector<int64_t>(10, 0));
  for (int64_t run = 0; run < kRuns; run += 64) {
    for (int64_t i = 0; i < kRun; ++i) x[i] = float_of(static_cast<uint32_t>(run * kRun + i));
    run_all(VectorIsa::baseline, base);
    for (size_t w = 0; w < wide.size(); ++w) {
      run_all(wide[w], got);
      for (int64_t part = 0; part < 10; ++part)
        differ[w][part] += !same_bits_or_nans(base.data() + part * kRun, got.data() + part * kRun);
    }
  }
  for (size_t w = 0; w < wide.size(); ++w)
    for (int64_t part = 0; part < 10; ++part) {
      INFO(cpu::vector_isa_name(wide[w]) << ", output " << part << ": runs that differ");
      CHECK(differ[w][part] == 0);
    }
}

// Odd lengths at 1 to 4 threads: every element of the dense ops must be the scalar kernel body's
// result (kernels/activations.h, run here one element at a time): the spans' math has no libm call,
// so a span, a scalar call and every thread split agree. With plain loops the elements at the end
// of a thread's chunk went through libm's scalar tanhf / expf, and the rest through libmvec's.
TEST_CASE("dense: gelu and swiglu give every element the kernel body's bits at any thread count",
          "[activation][dense]") {
  test::ThreadGuard threads_guard;
  const int64_t n = 100003;
  const Tensor x = test::random_tensor({n}, 22, 3.0f), gate = test::random_tensor({n}, 23, 3.0f);
  const Tensor up = test::random_tensor({n}, 24), dy = test::random_tensor({n}, 25);
  Tensor gelu_want = Tensor::empty({n}), dgelu_want = Tensor::empty({n});
  Tensor swiglu_want = Tensor::empty({n}), dgate_want = Tensor::empty({n}),
         dup_want = Tensor::empty({n});
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x.data<float>()[i], g = gate.data<float>()[i], u = up.data<float>()[i],
                d = dy.data<float>()[i];
    gelu_want.data<float>()[i] = kernels::gelu_tanh(xi);
    dgelu_want.data<float>()[i] = d * kernels::gelu_tanh_grad(xi);
    swiglu_want.data<float>()[i] = kernels::silu(g) * u;
    dgate_want.data<float>()[i] = d * u * kernels::silu_grad(g);
    dup_want.data<float>()[i] = d * kernels::silu(g);
  }
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
    // In place, as the MLP's backward calls them (dy and dx one tensor; dgate over dy).
    Tensor in_place = dy.clone();
    ops::gelu_backward(in_place, x, in_place);
    CHECK(test::bitwise_equal(in_place, dgelu_want));
    Tensor dgate_in_place = dy.clone(), dup2 = Tensor::empty({n});
    ops::swiglu_backward(dgate_in_place, gate, up, dgate_in_place, dup2);
    CHECK(test::bitwise_equal(dgate_in_place, dgate_want));
    CHECK(test::bitwise_equal(dup2, dup_want));
  }
}
