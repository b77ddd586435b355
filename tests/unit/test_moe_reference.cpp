// The fast MoE layer (router + dispatch plan + grouped GEMM + combine) against the slow per-token
// reference: forward output, aux and z losses, stats, dx and every parameter gradient.
// Shapes: N tokens, D model width, F expert hidden width, E experts, k top-k.
#include <catch2/catch.hpp>
#include <cmath>

#include "moe/nn/moe_reference.h"
#include "moe/ops/core.h"
#include "moe/rng.h"
#include "support/cuda.h"
#include "support/gradcheck.h"

using namespace moe;
using namespace moe::nn;

namespace {

// max |a - b| / max |b|
double rel_error(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  auto av = a.to_vector(), bv = b.to_vector();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(av[i]) - bv[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(bv[i])));
  }
  REQUIRE(scale > 0);
  return diff / scale;
}

struct Case {
  const char* name;
  Activation activation;
  int64_t experts, top_k;
  float capacity_factor, jitter;
  bool bias = false;  // swiglu only; gelu always has biases
  int64_t shared_ff = 0;
  bool shared_gate = false;
  bool sigmoid = false;       // sigmoid scoring with a (random) selection bias
  bool softmax_bias = false;  // softmax scoring with a (random) selection bias
};

MoEConfig make_config(const Case& c, int64_t d_model, int64_t d_ff) {
  MoEConfig config;
  const bool gpt = c.activation == Activation::gelu;
  config.router.d_model = d_model;
  config.router.num_experts = c.experts;
  config.router.top_k = c.top_k;
  config.router.normalize_topk = !gpt;
  config.router.capacity_factor = c.capacity_factor;
  config.router.jitter = c.jitter;
  config.experts = ExpertsConfig{c.experts, d_model, d_ff, c.activation, gpt || c.bias};
  config.router.scoring = c.sigmoid ? RouterScoring::sigmoid : RouterScoring::softmax;
  config.router.selection_bias = c.sigmoid || c.softmax_bias;
  config.shared_ff = c.shared_ff;
  config.shared_gate = c.shared_gate;
  return config;
}

}  // namespace

TEST_CASE("moe: fast layer equals the per-token reference (forward, losses, every gradient)",
          "[moe]") {
  const Case cases[] = {
      {"gpt k1 dropless", Activation::gelu, 6, 1, 0.0f, 0.0f},
      {"gpt k1 capacity", Activation::gelu, 6, 1, 1.0f, 0.0f},
      {"gpt k2 dropless jitter", Activation::gelu, 6, 2, 0.0f, 0.2f},
      {"gpt k2 capacity", Activation::gelu, 6, 2, 0.8f, 0.0f},
      {"gpt k3 E4 capacity", Activation::gelu, 4, 3, 0.9f, 0.0f},
      {"mixtral k1 capacity jitter", Activation::swiglu, 5, 1, 0.9f, 0.1f},
      {"mixtral k2 dropless", Activation::swiglu, 8, 2, 0.0f, 0.0f},
      {"mixtral k2 capacity", Activation::swiglu, 8, 2, 1.0f, 0.0f},
      {"mixtral k3 E4 dropless", Activation::swiglu, 4, 3, 0.0f, 0.0f},
      {"mixtral k3 E4 capacity", Activation::swiglu, 4, 3, 0.7f, 0.0f},
      {"swiglu with biases k2 capacity", Activation::swiglu, 6, 2, 0.9f, 0.0f, true},
      {"gpt k2 capacity, shared expert", Activation::gelu, 6, 2, 0.8f, 0.0f, false, 20},
      {"mixtral k2 dropless, gated shared expert", Activation::swiglu, 8, 2, 0.0f, 0.0f, false, 36,
       true},
      {"swiglu with biases k1 capacity jitter, gated shared expert", Activation::swiglu, 5, 1, 0.9f,
       0.1f, true, 12, true},
      {"gpt k2 capacity, sigmoid + bias", Activation::gelu, 6, 2, 0.8f, 0.0f, false, 0, false,
       true},
      {"mixtral k2 dropless, sigmoid + bias, gated shared expert", Activation::swiglu, 8, 2, 0.0f,
       0.0f, false, 24, true, true},
      {"mixtral k3 E4 capacity jitter, sigmoid + bias", Activation::swiglu, 4, 3, 0.8f, 0.1f, false,
       0, false, true},
      {"mixtral k2 dropless, softmax + bias", Activation::swiglu, 8, 2, 0.0f, 0.0f, false, 0, false,
       false, true},
  };
  const int64_t N = 48, D = 24, F = 40;
  const float aux_scale = 0.5f, z_scale = 0.05f;
  const double tol = 1e-5;
  uint64_t seed = 1000;
  for (const Case& c : cases) {
    INFO(c.name);
    ++seed;
    MoEConfig config = make_config(c, D, F);
    ParamSet ps(seed);
    MoELayer layer(ps, "blocks.2.moe", config);
    test::randomize_moe_params(ps, D, F, 0.1f, 77);
    Tensor x = test::random_tensor({N, D}, seed);
    Tensor dy = test::random_tensor({N, D}, seed + 500);
    RouterStep step{seed, 3, 2, true};

    MoELayer::Saved saved;
    MoEStats stats;
    Tensor y = layer.forward(x, step, &saved, &stats);
    Tensor dx = layer.backward(dy, saved, aux_scale, z_scale);
    MoEReferenceResult ref =
        moe_reference(ps, "blocks.2.moe", config, x, step, dy, aux_scale, z_scale);

    if (c.capacity_factor > 0) REQUIRE(stats.dropped > 0);
    if (config.router.selection_bias) {  // the bias must have moved some token's first choice
      const std::vector<float> s = saved.router.scores.to_vector();
      const std::vector<int32_t> idx = test::int_values(saved.router.topk_idx);
      int64_t moved = 0;
      for (int64_t t = 0; t < N; ++t) {
        int64_t best = 0;
        for (int64_t e = 1; e < c.experts; ++e)
          if (s[t * c.experts + e] > s[t * c.experts + best]) best = e;
        moved += idx[t * c.top_k] != best;
      }
      CHECK(moved > 0);
    }
    REQUIRE(stats.dropped == ref.stats.dropped);
    REQUIRE(stats.assignments == N * c.top_k);
    REQUIRE(stats.load == ref.stats.load);
    REQUIRE(stats.tokens_per_expert == ref.stats.tokens_per_expert);
    REQUIRE(stats.aux_loss == Approx(ref.aux_loss).epsilon(1e-5));
    REQUIRE(stats.z_loss == Approx(ref.z_loss).epsilon(1e-5));
    CHECK(rel_error(y, ref.y) < tol);
    CHECK(rel_error(dx, ref.dx) < tol);
    REQUIRE(ref.grads.size() == ps.size());
    for (Param* p : ps.all()) {
      INFO(p->name);
      REQUIRE(ref.grads.count(p->name) == 1);
      if (p->frozen) {  // the selection bias: no gradient, in both
        CHECK(ops::sum_squares(p->grad) == 0.0);
        CHECK(ops::sum_squares(ref.grads.at(p->name)) == 0.0);
        continue;
      }
      CHECK(rel_error(p->grad, ref.grads.at(p->name)) < tol);
    }
  }
}

TEST_CASE("moe: reference forward without dy gives outputs only, eval mode has no jitter",
          "[moe]") {
  Case c{"gpt", Activation::gelu, 4, 2, 0.0f, 0.3f};
  MoEConfig config = make_config(c, 16, 32);
  ParamSet ps(9);
  MoELayer layer(ps, "m", config);
  test::randomize_moe_params(ps, 16, 32, 0.1f, 77);
  Tensor x = test::random_tensor({20, 16}, 9);
  RouterStep eval{9, 0, 0, false};
  MoEReferenceResult ref = moe_reference(ps, "m", config, x, eval);
  REQUIRE_FALSE(ref.dx.defined());
  REQUIRE(ref.grads.empty());
  Tensor y = layer.forward(x, eval, nullptr, nullptr);
  REQUIRE(rel_error(y, ref.y) < 2e-5);
  // Training mode with jitter routes differently from eval for the same weights.
  Tensor y_train = layer.forward(x, RouterStep{9, 0, 0, true}, nullptr, nullptr);
  REQUIRE(rel_error(y_train, ref.y) > 1e-4);
}

TEST_CASE("moe: an empty batch flows through forward and backward", "[moe]") {
  Case c{"gpt", Activation::gelu, 4, 2, 1.0f, 0.1f};
  MoEConfig config = make_config(c, 8, 16);
  ParamSet ps(10);
  MoELayer layer(ps, "m", config);
  Tensor x = Tensor::zeros({0, 8});
  MoELayer::Saved saved;
  MoEStats stats;
  Tensor y = layer.forward(x, RouterStep{1, 0, 0, true}, &saved, &stats);
  REQUIRE(y.shape() == Shape{0, 8});
  REQUIRE(stats.assignments == 0);
  REQUIRE(stats.aux_loss == 0.0);
  Tensor dx = layer.backward(Tensor::zeros({0, 8}), saved, 1.0f, 1.0f);
  REQUIRE(dx.shape() == Shape{0, 8});
  for (Param* p : ps.all()) REQUIRE(ops::sum_squares(p->grad) == 0.0);
}
