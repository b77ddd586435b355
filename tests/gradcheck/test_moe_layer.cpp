// Finite-difference checks of the MoE layer's backward: the router (gate weights, aux loss,
// z-loss; softmax or sigmoid scoring), the grouped-GEMM experts (gelu + bias, swiglu) and the whole
// layer for k = 1, 2, dropless and with capacity drops, gpt and mixtral flavours, with a shared
// expert (gated or not), sigmoid scoring with a selection bias, and a centred router (its weight
// acts through the projection W' = W - C (W c) c^T / |c|^2), w.r.t. x and every parameter.
//
// Top-k is piecewise constant: the router weights give well-separated logits, eps is small, and
// every perturbed forward must reproduce the unperturbed routing (checked).
//
// Shapes: N tokens, D model width, F expert hidden width, E experts, k top-k, M kept assignments.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "moe/nn/moe_layer.h"
#include "moe/rng.h"
#include "support/gradcheck.h"

using namespace moe;
using namespace moe::nn;

namespace {

constexpr double kTol = 1e-2;

bool same_ints(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

struct RouterCase {
  int64_t k;
  bool normalize;
  float capacity_factor, jitter;
  bool sigmoid = false;  // sigmoid scoring with a random selection bias
  bool center = false;   // a centred router (RouterConfig::center) with a random center
};

void check_router(const RouterCase& rc_case, double gate_scale, float aux_scale, float z_scale) {
  const int64_t N = 24, D = 10, E = 5;
  RouterConfig rc;
  rc.d_model = D;
  rc.num_experts = E;
  rc.top_k = rc_case.k;
  rc.normalize_topk = rc_case.normalize;
  rc.capacity_factor = rc_case.capacity_factor;
  rc.jitter = rc_case.jitter;
  rc.scoring = rc_case.sigmoid ? RouterScoring::sigmoid : RouterScoring::softmax;
  rc.selection_bias = rc_case.sigmoid;
  rc.center = rc_case.center;
  ParamSet ps(17);
  Router router(ps, "blocks.0.moe.router", rc);
  test::randomize_param(router.weight(), 18, 3.0f / std::sqrt(float(D)));
  if (rc_case.sigmoid) test::randomize_param(*router.selection_bias(), 21, 0.3f);
  if (rc_case.center) test::randomize_param(*router.center(), 23, 1.0f);
  Tensor x = test::random_tensor({N, D}, 19);
  RouterStep step{4, 5, 0, true};
  RouterOutput base = router.forward(x, step);
  if (rc_case.capacity_factor > 0) REQUIRE(base.plan.dropped() > 0);
  Tensor r = test::random_tensor({base.plan.num_slots()}, 20);
  bool routing_changed = false;
  auto loss = [&]() {
    RouterOutput out = router.forward(x, step);
    if (!same_ints(out.topk_idx, base.topk_idx) || !same_ints(out.plan.slot_of, base.plan.slot_of))
      routing_changed = true;
    return gate_scale * test::dot(out.plan.weight_of_slot, r) + aux_scale * out.aux_loss +
           z_scale * out.z_loss;
  };
  Tensor dr = r.clone();
  float* drs = dr.data<float>();
  for (int64_t i = 0; i < dr.numel(); ++i) drs[i] *= static_cast<float>(gate_scale);
  ps.zero_grad();
  Tensor dx = router.backward(dr, base, x, aux_scale, z_scale);
  MOE_REQUIRE_GRAD(test::check_gradient(x, dx, loss, 2e-3), kTol);
  MOE_REQUIRE_GRAD(test::check_gradient(router.weight().value, router.weight().grad, loss, 2e-3),
                   kTol);
  REQUIRE_FALSE(routing_changed);
}

}  // namespace

TEST_CASE("moe: router gradcheck (gate weights, aux loss, z-loss) w.r.t. x and weight",
          "[moe][gradcheck]") {
  const RouterCase cases[] = {
      {1, false, 0.0f, 0.0f},
      {2, false, 0.0f, 0.1f},
      {2, true, 0.0f, 0.0f},
      {2, true, 0.8f, 0.0f},
      {3, true, 0.0f, 0.1f},
      {1, false, 0.0f, 0.0f, true},
      {2, true, 0.0f, 0.1f, true},
      {2, false, 0.8f, 0.0f, true},
      {2, false, 0.0f, 0.1f, false, true},
      {2, true, 0.8f, 0.0f, false, true},
      {2, true, 0.0f, 0.0f, true, true},
  };
  for (const RouterCase& c : cases) {
    INFO("k " << c.k << " normalize " << c.normalize << " cf " << c.capacity_factor << " jitter "
              << c.jitter << " sigmoid " << c.sigmoid << " center " << c.center);
    {
      INFO("gate only");
      check_router(c, 1.0, 0.0f, 0.0f);
    }
    {
      INFO("aux only");
      check_router(c, 0.0, 1.0f, 0.0f);
    }
    {
      INFO("z only");
      check_router(c, 0.0, 0.0f, 1.0f);
    }
    {
      INFO("gate, aux and z");
      check_router(c, 1.0, 0.7f, 0.05f);
    }
  }
}

TEST_CASE("moe: experts gradcheck (gelu + bias, swiglu) over uneven segments", "[moe][gradcheck]") {
  struct ExpertCase {
    Activation activation;
    bool bias;
  };
  for (ExpertCase c : {ExpertCase{Activation::gelu, true}, ExpertCase{Activation::swiglu, false},
                       ExpertCase{Activation::swiglu, true}}) {
    INFO("swiglu " << (c.activation == Activation::swiglu) << " bias " << c.bias);
    const int64_t E = 4, D = 6, F = 10;
    ExpertsConfig config{E, D, F, c.activation, c.bias};
    ParamSet ps(23);
    Experts experts(ps, "blocks.0.moe.experts", config);
    for (Param* p : ps.all()) test::randomize_param(*p, hash_name(p->name), 0.4f);
    const std::vector<int32_t> offsets{0, 5, 5, 12, 15};  // expert 1 has no tokens
    Tensor x_perm = test::random_tensor({15, D}, 24);
    Tensor r = test::random_tensor({15, D}, 25);
    auto loss = [&]() { return test::dot(experts.forward(x_perm, offsets, nullptr), r); };
    Experts::Saved saved;
    experts.forward(x_perm, offsets, &saved);
    ps.zero_grad();
    Tensor dx = experts.backward(r, saved);
    MOE_REQUIRE_GRAD(test::check_gradient(x_perm, dx, loss), kTol);
    for (Param* p : ps.all()) {
      INFO(p->name);
      MOE_REQUIRE_GRAD(test::check_gradient(p->value, p->grad, loss), kTol);
    }
    // The empty expert's weights get no gradient.
    const float* g1 = experts.w1().grad.data<float>();
    for (int64_t i = F * D; i < 2 * F * D; ++i) REQUIRE(g1[i] == 0.0f);
  }
}

TEST_CASE("moe: layer gradcheck, gpt and mixtral, k 1 and 2, dropless and with drops",
          "[moe][gradcheck]") {
  struct LayerCase {
    const char* name;
    bool mixtral;
    int64_t k;
    float capacity_factor;
    int64_t shared_ff = 0;  // a shared expert (its params: w1, w2, w3 or b1, b2; and the gate)
    bool shared_gate = false;
    bool sigmoid = false;  // sigmoid scoring and a (random) selection bias
  };
  const LayerCase cases[] = {
      {"gpt k1 dropless", false, 1, 0.0f},
      {"gpt k1 drops", false, 1, 0.75f},
      {"gpt k2 dropless", false, 2, 0.0f},
      {"gpt k2 drops", false, 2, 0.75f},
      {"mixtral k1 dropless", true, 1, 0.0f},
      {"mixtral k1 drops", true, 1, 0.75f},
      {"mixtral k2 dropless", true, 2, 0.0f},
      {"mixtral k2 drops", true, 2, 0.75f},
      {"gpt k2 drops, shared expert", false, 2, 0.75f, 10},
      {"mixtral k2 dropless, gated shared expert", true, 2, 0.0f, 10, true},
      {"gpt k2 drops, sigmoid + bias", false, 2, 0.75f, 0, false, true},
      {"mixtral k2 dropless, sigmoid + bias, gated shared expert", true, 2, 0.0f, 10, true, true},
  };
  const int64_t N = 24, D = 8, E = 4, F = 12;
  const float aux_scale = 0.5f, z_scale = 0.05f;
  uint64_t seed = 300;
  for (const LayerCase& c : cases) {
    INFO(c.name);
    ++seed;
    MoEConfig config;
    config.router.d_model = D;
    config.router.num_experts = E;
    config.router.top_k = c.k;
    config.router.normalize_topk = c.mixtral;
    config.router.capacity_factor = c.capacity_factor;
    config.router.jitter = c.mixtral ? 0.0f : 0.05f;
    config.experts =
        ExpertsConfig{E, D, F, c.mixtral ? Activation::swiglu : Activation::gelu, !c.mixtral};
    config.shared_ff = c.shared_ff;
    config.shared_gate = c.shared_gate;
    config.router.scoring = c.sigmoid ? RouterScoring::sigmoid : RouterScoring::softmax;
    config.router.selection_bias = c.sigmoid;
    ParamSet ps(seed);
    MoELayer layer(ps, "blocks.1.moe", config);
    test::randomize_moe_params(ps, D, F, 0.2f, 0x5eed);
    Tensor x = test::random_tensor({N, D}, seed);
    Tensor r = test::random_tensor({N, D}, seed + 1);
    RouterStep step{seed, 2, 1, true};

    MoELayer::Saved saved;
    MoEStats stats;
    layer.forward(x, step, &saved, &stats);
    if (c.capacity_factor > 0)
      REQUIRE(stats.dropped > 0);
    else
      REQUIRE(stats.dropped == 0);
    const Tensor base_idx = saved.router.topk_idx.clone();
    const Tensor base_slots = saved.router.plan.slot_of.clone();
    bool routing_changed = false;
    auto loss = [&]() {
      MoELayer::Saved s;
      MoEStats st;
      Tensor y = layer.forward(x, step, &s, &st);
      if (!same_ints(s.router.topk_idx, base_idx) || !same_ints(s.router.plan.slot_of, base_slots))
        routing_changed = true;
      return test::dot(y, r) + aux_scale * st.aux_loss + z_scale * st.z_loss;
    };
    ps.zero_grad();
    Tensor dx = layer.backward(r, saved, aux_scale, z_scale);
    MOE_REQUIRE_GRAD(test::check_gradient(x, dx, loss, 2e-3), kTol);
    const size_t shared_params = c.shared_ff == 0 ? 0 : (c.mixtral ? 3u : 4u) + c.shared_gate;
    REQUIRE(ps.size() == (c.mixtral ? 4u : 5u) + shared_params + c.sigmoid);
    for (Param* p : ps.all()) {
      INFO(p->name);
      if (p->frozen) {  // the selection bias only moves choices: no gradient, numerically none
        const test::GradCheckResult g = test::check_gradient(p->value, p->grad, loss, 2e-3);
        REQUIRE(g.grad_scale == 0.0);
        REQUIRE(g.max_error == 0.0);
        continue;
      }
      MOE_REQUIRE_GRAD(test::check_gradient(p->value, p->grad, loss, 2e-3), kTol);
    }
    REQUIRE_FALSE(routing_changed);
  }
}
