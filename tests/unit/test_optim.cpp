#include <catch2/catch.hpp>
#include <cmath>

#include "moe/optim/adamw.h"
#include "support/gradcheck.h"

using namespace moe;

TEST_CASE("optim: AdamW step matches the closed form", "[optim]") {
  ParamSet ps(3);
  Param& w = ps.add("w", {5}, Init::normal(1.0f), /*decay=*/true);
  Param& b = ps.add("b", {5}, Init::normal(1.0f), /*decay=*/false);
  std::vector<float> w0 = w.value.to_vector(), b0 = b.value.to_vector();
  Tensor g = test::random_tensor({5}, 11);
  w.grad.copy_from(g);
  b.grad.copy_from(g);
  optim::AdamWConfig c;
  c.weight_decay = 0.1f;
  optim::AdamW opt(ps, c);
  opt.step(0.01f);
  // First step: m_hat = g, v_hat = g^2 -> update = lr * (g / (|g| + eps) + wd * w)
  for (int i = 0; i < 5; ++i) {
    float gi = g.data<float>()[i];
    float expect_w = w0[i] - 0.01f * (gi / (std::fabs(gi) + 1e-8f) + 0.1f * w0[i]);
    float expect_b = b0[i] - 0.01f * (gi / (std::fabs(gi) + 1e-8f));
    REQUIRE(w.value.data<float>()[i] == Approx(expect_w).epsilon(1e-6));
    REQUIRE(b.value.data<float>()[i] == Approx(expect_b).epsilon(1e-6));
  }
  REQUIRE(opt.steps_taken() == 1);
}

TEST_CASE("optim: bf16 parameters keep an fp32 master that accumulates small updates", "[optim]") {
  ParamSet ps(3, DType::bf16);
  Param& w = ps.add("w", {4}, Init::ones(), false);
  REQUIRE(w.value.dtype() == DType::bf16);
  optim::AdamWConfig c;
  c.weight_decay = 0;
  optim::AdamW opt(ps, c);
  // Each step moves the master by 1e-3, far below bf16's resolution near 1 (2^-7).
  for (int s = 0; s < 20; ++s) {
    w.grad.fill(1.0f);
    opt.step(1e-3f);
  }
  auto state = opt.state();
  const Tensor* master = nullptr;
  for (auto& t : state)
    if (t.name == "master.w") master = &t.tensor;
  REQUIRE(master != nullptr);
  REQUIRE(master->data<float>()[0] == Approx(1.0f - 20e-3f).epsilon(1e-4));
  // The stored value is the rounded master, and the compute copy equals the stored value.
  REQUIRE(w.value.to_vector()[0] == Approx(0.98f).epsilon(4e-3));
  REQUIRE(w.value.to_vector()[0] != 1.0f);
  REQUIRE(w.w().data<float>()[0] == w.value.to_vector()[0]);
}

TEST_CASE("optim: gradient clipping scales to the max norm", "[optim]") {
  ParamSet ps(3);
  Param& a = ps.add("a", {3}, Init::zeros());
  Param& b = ps.add("b", {1}, Init::zeros());
  a.grad.copy_from(Tensor::from_vector({3}, std::vector<float>{3, 0, 0}));
  b.grad.copy_from(Tensor::from_vector({1}, std::vector<float>{4}));
  REQUIRE(optim::clip_grad_norm(ps, 10.0) == Approx(5.0));
  REQUIRE(a.grad.data<float>()[0] == 3.0f);  // under the limit: untouched
  REQUIRE(optim::clip_grad_norm(ps, 1.0) == Approx(5.0));
  REQUIRE(a.grad.data<float>()[0] == Approx(0.6f).epsilon(1e-5));
  REQUIRE(b.grad.data<float>()[0] == Approx(0.8f).epsilon(1e-5));
}

TEST_CASE("optim: warmup then cosine schedule", "[optim]") {
  REQUIRE(optim::lr_at(0, 100, 10, 1.0f, 0.1f) == Approx(0.1f));
  REQUIRE(optim::lr_at(9, 100, 10, 1.0f, 0.1f) == Approx(1.0f));
  REQUIRE(optim::lr_at(10, 100, 10, 1.0f, 0.1f) == Approx(1.0f));
  REQUIRE(optim::lr_at(55, 100, 10, 1.0f, 0.1f) == Approx(0.55f));
  REQUIRE(optim::lr_at(100, 100, 10, 1.0f, 0.1f) == Approx(0.1f));
  for (int s = 11; s < 100; ++s)
    REQUIRE(optim::lr_at(s, 100, 10, 1.0f, 0.1f) <= optim::lr_at(s - 1, 100, 10, 1.0f, 0.1f));
}
