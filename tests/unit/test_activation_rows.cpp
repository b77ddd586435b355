// The CPU activation spans (backend/cpu/activation_rows.h): the dense activation ops give every
// element the spans' bits whatever the thread count and the tensor's length (a plain OpenMP loop
// sent the elements at the end of a thread's chunk through libm's scalar tanhf / expf, whose bits
// differ from libmvec's vector ones).
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/activation_rows.h"
#include "kernels/activations.h"
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

}  // namespace

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
