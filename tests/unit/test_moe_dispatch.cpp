// Dispatch plan (make_plan), dispatch/combine, router jitter and thread-count independence of the
// MoE layer. Shapes: N tokens, D model width, F expert hidden width, E experts, k top-k.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <set>
#include <tuple>

#include "core/parallel.h"
#include "moe/nn/moe_layer.h"
#include "moe/ops/moe.h"
#include "moe/rng.h"
#include "moe/threads.h"
#include "support/gradcheck.h"

using namespace moe;
using namespace moe::nn;

namespace {

std::vector<int32_t> ints(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

// Random top-k choices: k distinct experts per token, skewed so that some experts are popular.
void random_choices(int64_t tokens, int64_t k, int64_t experts, uint64_t seed, Tensor& idx,
                    Tensor& weight) {
  idx = Tensor::empty({tokens, k}, DType::i32);
  weight = test::random_tensor({tokens, k}, seed + 1);
  Tensor draws = test::random_ids({tokens, k * 8}, seed, static_cast<int32_t>(experts * 2));
  const int32_t* d = draws.data<int32_t>();
  int32_t* out = idx.data<int32_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    std::set<int32_t> used;
    int64_t j = 0;
    for (int64_t i = 0; i < k * 8 && j < k; ++i) {
      int32_t e = std::min<int32_t>(d[t * k * 8 + i], static_cast<int32_t>(experts) - 1);
      if (used.insert(e).second) out[t * k + j++] = e;
    }
    for (int32_t e = 0; j < k; ++e)
      if (used.insert(e).second) out[t * k + j++] = e;
  }
}

void check_plan_invariants(const Tensor& idx, const Tensor& weight, const DispatchPlan& plan,
                           int64_t capacity) {
  const int64_t N = idx.dim(0), k = idx.dim(1), E = plan.num_experts;
  const int32_t* choice = idx.data<int32_t>();
  const float* w = weight.data<float>();
  const auto slot_of = ints(plan.slot_of);
  const auto token_of_slot = ints(plan.token_of_slot);
  const float* weight_of_slot = plan.weight_of_slot.data<float>();
  const int64_t M = plan.num_slots();
  REQUIRE(plan.expert_offsets.size() == static_cast<size_t>(E + 1));
  REQUIRE(plan.expert_offsets[0] == 0);
  int64_t kept = 0;
  for (int64_t e = 0; e < E; ++e) {
    REQUIRE(plan.expert_offsets[e + 1] - plan.expert_offsets[e] == plan.tokens_per_expert[e]);
    if (capacity > 0) REQUIRE(plan.tokens_per_expert[e] <= capacity);
    kept += plan.tokens_per_expert[e];
  }
  REQUIRE(kept == M);
  REQUIRE(M + plan.dropped() == N * k);
  REQUIRE(plan.token_of_slot.numel() == M);
  // slot_of and token_of_slot are inverses; each slot is used once, by an assignment of its expert.
  std::vector<int64_t> assignment_of_slot(M, -1);
  for (int64_t a = 0; a < N * k; ++a) {
    int32_t s = slot_of[a];
    if (s < 0) continue;
    REQUIRE(s < M);
    REQUIRE(assignment_of_slot[s] == -1);
    assignment_of_slot[s] = a;
    REQUIRE(token_of_slot[s] == a / k);
    REQUIRE(weight_of_slot[s] == w[a]);
    int32_t e = choice[a];
    REQUIRE(s >= plan.expert_offsets[e]);
    REQUIRE(s < plan.expert_offsets[e + 1]);
  }
  for (int64_t s = 0; s < M; ++s) REQUIRE(assignment_of_slot[s] >= 0);
  // Inside an expert, slots follow priority (choice j, then token t); every dropped assignment of
  // an expert has lower priority than all of its kept ones.
  auto priority = [&](int64_t a) { return std::make_tuple(a % k, a / k); };
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s = plan.expert_offsets[e] + 1; s < plan.expert_offsets[e + 1]; ++s)
      REQUIRE(priority(assignment_of_slot[s - 1]) < priority(assignment_of_slot[s]));
    if (plan.tokens_per_expert[e] == 0) continue;
    auto last_kept = priority(assignment_of_slot[plan.expert_offsets[e + 1] - 1]);
    for (int64_t a = 0; a < N * k; ++a)
      if (choice[a] == e && slot_of[a] < 0) REQUIRE(priority(a) > last_kept);
  }
}

void randomize(Param& p, uint64_t seed, float scale) {
  p.value.copy_from(test::random_tensor(p.value.shape(), seed, scale));
  p.refresh_compute();
}

}  // namespace

TEST_CASE("moe: make_plan on a hand-made example, dropless and with capacity", "[moe]") {
  Tensor idx = Tensor::from_vector({4, 2}, std::vector<int32_t>{0, 1, 0, 2, 1, 0, 0, 1});
  Tensor w =
      Tensor::from_vector({4, 2}, std::vector<float>{.6f, .4f, .7f, .3f, .8f, .2f, .9f, .1f});
  DispatchPlan dropless = make_plan(idx, w, 3, 0);
  REQUIRE(dropless.tokens_per_expert == std::vector<int32_t>{4, 3, 1});
  REQUIRE(dropless.expert_offsets == std::vector<int32_t>{0, 4, 7, 8});
  REQUIRE(dropless.dropped() == 0);
  REQUIRE(dropless.num_slots() == 8);
  // expert 0: first choices of tokens 0, 1, 3, then token 2's second choice.
  REQUIRE(ints(dropless.token_of_slot) == std::vector<int32_t>{0, 1, 3, 2, 2, 0, 3, 1});
  REQUIRE(ints(dropless.slot_of) == std::vector<int32_t>{0, 5, 1, 7, 4, 3, 2, 6});
  check_plan_invariants(idx, w, dropless, 0);

  DispatchPlan capped = make_plan(idx, w, 3, 2);
  REQUIRE(capped.tokens_per_expert == std::vector<int32_t>{2, 2, 1});
  // The load the aux loss sees counts every assignment, dropped ones too.
  REQUIRE(capped.load == std::vector<int64_t>{4, 3, 1});
  REQUIRE(dropless.load == capped.load);
  REQUIRE(capped.expert_offsets == std::vector<int32_t>{0, 2, 4, 5});
  REQUIRE(capped.dropped() == 3);
  REQUIRE(ints(capped.slot_of) == std::vector<int32_t>{0, 3, 1, 4, 2, -1, -1, -1});
  check_plan_invariants(idx, w, capped, 2);

  // combine: token 3 lost both choices and gets 0; token 2 keeps its first choice only.
  Tensor x = test::random_tensor({4, 5}, 11);
  Tensor y = combine(dispatch(x, capped), capped);
  const float* xs = x.data<float>();
  const float* ys = y.data<float>();
  for (int d = 0; d < 5; ++d) {
    REQUIRE(ys[0 * 5 + d] == Approx((0.6f + 0.4f) * xs[0 * 5 + d]).epsilon(1e-6));
    REQUIRE(ys[2 * 5 + d] == Approx(0.8f * xs[2 * 5 + d]).epsilon(1e-6));
    REQUIRE(ys[3 * 5 + d] == 0.0f);
  }
}

TEST_CASE("moe: make_plan invariants on random routings, dropless keeps everything", "[moe]") {
  for (int64_t k : {1, 2, 3}) {
    for (int64_t capacity : {0, 1, 5, 12, 1000}) {
      Tensor idx, w;
      random_choices(97, k, 6, 100 + k, idx, w);
      DispatchPlan plan = make_plan(idx, w, 6, capacity);
      INFO("k " << k << " capacity " << capacity);
      check_plan_invariants(idx, w, plan, capacity);
      REQUIRE(plan.load == ops::router_load(idx, 6));
      if (capacity == 0 || capacity == 1000) {
        REQUIRE(plan.dropped() == 0);
        REQUIRE(plan.num_slots() == 97 * k);
      }
      if (capacity == 5) REQUIRE(plan.dropped() > 0);
    }
  }
}

TEST_CASE("moe: make_plan rejects bad routings with clear errors", "[moe]") {
  Tensor idx = Tensor::from_vector({2, 3}, std::vector<int32_t>{0, 1, 0, 1, 0, 1});
  Tensor w = test::random_tensor({2, 3}, 3);
  REQUIRE_THROWS_WITH(make_plan(idx, w, 2, 0),
                      Catch::Contains("top_k 3") && Catch::Contains("num_experts = 2"));
  Tensor out_of_range = Tensor::from_vector({2, 1}, std::vector<int32_t>{0, 4});
  REQUIRE_THROWS_WITH(make_plan(out_of_range, test::random_tensor({2, 1}, 4), 4, 0),
                      Catch::Contains("expert id 4"));
  Tensor twice = Tensor::from_vector({1, 2}, std::vector<int32_t>{1, 1});
  REQUIRE_THROWS_WITH(make_plan(twice, test::random_tensor({1, 2}, 5), 3, 0),
                      Catch::Contains("twice"));
  REQUIRE_THROWS_WITH(make_plan(idx.reshape({3, 2}), w, 2, 0), Catch::Contains("[3,2]"));
  ParamSet ps(1);
  RouterConfig rc{16, 4, 5};
  REQUIRE_THROWS_AS(Router(ps, "r", rc), UsageError);
}

TEST_CASE("moe: dispatch, combine and their backward move rows by the plan", "[moe]") {
  Tensor idx, w;
  random_choices(33, 2, 5, 7, idx, w);
  DispatchPlan plan = make_plan(idx, w, 5, 10);
  REQUIRE(plan.dropped() > 0);
  Tensor x = test::random_tensor({33, 7}, 8);
  Tensor x_perm = dispatch(x, plan);
  REQUIRE(x_perm.shape() == Shape{plan.num_slots(), 7});
  const auto token_of_slot = ints(plan.token_of_slot);
  for (int64_t s = 0; s < plan.num_slots(); ++s)
    REQUIRE(std::memcmp(x_perm.data<float>() + s * 7, x.data<float>() + token_of_slot[s] * 7,
                        7 * sizeof(float)) == 0);
  // dispatch_backward is the adjoint of dispatch: <dispatch(x), g> == <x, dispatch_backward(g)>.
  Tensor g = test::random_tensor({plan.num_slots(), 7}, 9);
  REQUIRE(test::dot(x_perm, g) == Approx(test::dot(x, dispatch_backward(g, plan))).epsilon(1e-5));
  // combine_backward: dy_perm is the adjoint of combine in y_perm, dweight the gate derivative.
  Tensor y_perm = test::random_tensor({plan.num_slots(), 7}, 10);
  Tensor dy = test::random_tensor({33, 7}, 11);
  Tensor dy_perm, dweight;
  combine_backward(dy, y_perm, plan, dy_perm, dweight);
  REQUIRE(test::dot(combine(y_perm, plan), dy) == Approx(test::dot(y_perm, dy_perm)).epsilon(1e-5));
  const float* ws = plan.weight_of_slot.data<float>();
  double by_weight = 0;
  for (int64_t s = 0; s < plan.num_slots(); ++s) by_weight += ws[s] * dweight.data<float>()[s];
  REQUIRE(test::dot(combine(y_perm, plan), dy) == Approx(by_weight).epsilon(1e-5));
}

TEST_CASE("moe: router capacity is ceil(cf * N * k / E)", "[moe]") {
  REQUIRE(router_capacity(1.25f, 10, 2, 4) == 7);
  REQUIRE(router_capacity(1.0f, 16, 1, 4) == 4);
  REQUIRE(router_capacity(0.0f, 16, 1, 4) == 0);
}

TEST_CASE("moe: router jitter is keyed by seed, step and layer, and off in eval", "[moe]") {
  ParamSet ps(3);
  RouterConfig rc;
  rc.d_model = 12;
  rc.num_experts = 4;
  rc.top_k = 2;
  rc.jitter = 0.1f;
  Router router(ps, "blocks.0.moe.router", rc);
  Tensor x = test::random_tensor({20, 12}, 21);
  RouterStep step{42, 7, 1, true};
  RouterOutput a = router.forward(x, step);
  RouterOutput b = router.forward(x, step);
  REQUIRE(a.jitter_noise.defined());
  REQUIRE(std::memcmp(a.jitter_noise.raw(), b.jitter_noise.raw(), a.jitter_noise.nbytes()) == 0);
  REQUIRE(std::memcmp(a.routed_input.raw(), b.routed_input.raw(), a.routed_input.nbytes()) == 0);
  for (float f : a.jitter_noise.to_vector()) {
    REQUIRE(f > 0.9f);
    REQUIRE(f < 1.1f);
  }
  RouterOutput other_step = router.forward(x, RouterStep{42, 8, 1, true});
  RouterOutput other_layer = router.forward(x, RouterStep{42, 7, 2, true});
  RouterOutput other_seed = router.forward(x, RouterStep{43, 7, 1, true});
  for (const RouterOutput* o : {&other_step, &other_layer, &other_seed})
    REQUIRE(std::memcmp(a.jitter_noise.raw(), o->jitter_noise.raw(), a.jitter_noise.nbytes()) != 0);
  RouterOutput eval = router.forward(x, RouterStep{42, 7, 1, false});
  REQUIRE_FALSE(eval.jitter_noise.defined());
  REQUIRE(std::memcmp(eval.routed_input.raw(), x.raw(), x.nbytes()) == 0);
  RouterConfig plain = rc;
  plain.jitter = 0.0f;
  ParamSet ps2(3);
  Router no_jitter(ps2, "blocks.0.moe.router", plain);
  RouterOutput c = no_jitter.forward(x, step);
  REQUIRE_FALSE(c.jitter_noise.defined());
  REQUIRE(std::memcmp(eval.logits.raw(), c.logits.raw(), c.logits.nbytes()) == 0);
  REQUIRE(std::memcmp(eval.logits.raw(), a.logits.raw(), c.logits.nbytes()) != 0);
}

TEST_CASE("moe: layer forward and backward are bitwise independent of the thread count", "[moe]") {
  MoEConfig config;
  // Large enough (N*E >= cpu::kParallelWork) that every OpenMP loop of the layer forks.
  config.router = RouterConfig{32, 8, 2};
  config.router.capacity_factor = 1.0f;
  config.router.jitter = 0.05f;
  config.experts = ExpertsConfig{8, 32, 48};
  Tensor x = test::random_tensor({4096, 32}, 31);
  Tensor dy = test::random_tensor({4096, 32}, 32);
  struct Run {
    std::vector<float> y, dx;
    std::vector<std::vector<float>> grads;
    int64_t dropped;
  };
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    moe::set_num_threads(threads);
    ParamSet ps(5);
    MoELayer layer(ps, "blocks.1.moe", config);
    for (Param* p : ps.all()) randomize(*p, hash_name(p->name), 0.2f);
    MoELayer::Saved saved;
    MoEStats stats;
    Tensor y = layer.forward(x, RouterStep{1, 2, 1, true}, &saved, &stats);
    Tensor dx = layer.backward(dy, saved, 0.1f, 0.01f);
    Run r{y.to_vector(), dx.to_vector(), {}, stats.dropped};
    for (Param* p : ps.all()) r.grads.push_back(p->grad.to_vector());
    return r;
  };
  Run one = run(1);
  Run two = run(2);
  omp_set_num_threads(2);
  moe::set_num_threads(2);
  static_assert(4096 * 8 >= cpu::kParallelWork);
  REQUIRE(one.dropped > 0);
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  REQUIRE(same_bits(one.y, two.y));
  REQUIRE(same_bits(one.dx, two.dx));
  REQUIRE(one.grads.size() == 5);  // router.weight, w1, w2, b1, b2
  for (size_t i = 0; i < one.grads.size(); ++i) {
    INFO("parameter " << i);
    CHECK(same_bits(one.grads[i], two.grads[i]));
  }
}
