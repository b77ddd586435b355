// The gpt_oss family (issue 44, step 3 C1): ModelConfig's arch gpt_oss and the flavour it selects
// (models/gpt_oss.cpp): mixtral's layers with q/k/v/o biases, expert biases b1/b3/b2, attention
// sinks, the clamped SwiGLU of swiglu_alpha / swiglu_limit, a trained router logit bias and the
// top-k renormalised. Tested: the parameters' names, shapes and dtypes (sinks f32 in a bf16 model);
// the config's JSON (alpha/limit written for gpt_oss only, old files read with the defaults);
// refusals in the user's words (alpha/limit on another family, bad values, dense layers, shared
// experts, the arch's name); plan::param_counts against the ParamSet; each feature's wiring (the
// sinks, the router bias, the biases, alpha and limit each move the logits); the whole model's
// gradient by finite differences; training steps whose loss is finite and falls; and the cached
// decode against the uncached forward with windows on alternating layers, sinks, grouped-query
// heads, head_dim != D / H and YaRN (truncate false, as gpt-oss's config has it).
// Shape letters: V vocabulary, D width, H heads, KV key/value heads, hd head dim, F expert hidden,
// E experts, T sequence.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/models/transformer.h"
#include "moe/optim/adamw.h"
#include "moe/param.h"
#include "moe/plan/memory_model.h"
#include "moe/rng.h"
#include "support/gradcheck.h"
#include "support/run.h"

using namespace moe;

namespace {

// V 40, D 32, H 4, KV 2, hd 12 (H hd = 48 != D), F 16, E 4 top-2, 3 layers with windows of 4 on
// layers 0 and 2 (HF's default layer_types), T 12, YaRN factor 4 over an original context of 8.
ModelConfig tiny_gpt_oss() {
  ModelConfig c;
  c.arch = Arch::gpt_oss;
  c.vocab_size = 40, c.layers = 3, c.d_model = 32, c.heads = 4, c.kv_heads = 2, c.head_dim = 12;
  c.d_ff = 16, c.seq = 12, c.experts = 4, c.moe_every = 1, c.top_k = 2;
  c.normalize_topk = true;
  c.sliding_window = 4;
  c.window_layers = {0, 2};
  c.rope_theta = 150000;
  c.rope_type = RopeType::yarn;
  c.yarn.factor = 4, c.yarn.original_ctx = 8, c.yarn.truncate = false;
  return c;
}

// Every trained parameter but the norms drawn at random (the biases, sinks and router logit bias
// start at zero: a test of their wiring needs them not to be), scale 0.4; the sinks wider (+-1.2)
// so that each takes a share of O(0.1-0.5) of its rows.
void randomise(ParamSet& ps) {
  for (Param* p : ps.all()) {
    if (p->name.find("norm") != std::string::npos || p->frozen) continue;
    const bool sinks = p->name.find(".sinks") != std::string::npos;
    p->value.copy_from(
        test::random_tensor(p->value.shape(), hash_name(p->name), sinks ? 1.2f : 0.4f));
    p->refresh_compute();
  }
}

std::vector<int32_t> ids_of(int64_t T, int32_t V, int32_t step) {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) ids.push_back(static_cast<int32_t>((t * step + 3) % V));
  return ids;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  REQUIRE(x.size() == y.size());
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::fabs(double(x[i]) - double(y[i])));
  return d;
}

// The logits of `c` with the parameters of `from` (same names and shapes).
Tensor logits_with(const ModelConfig& c, const ParamSet& from, const Tensor& ids) {
  ParamSet ps(1);
  Transformer model(c, ps);
  for (Param* p : ps.all()) {
    const Param* src = from.find(p->name);
    REQUIRE(src != nullptr);
    p->value.copy_from(src->value);
    p->refresh_compute();
  }
  return model.logits(ids);
}

}  // namespace

TEST_CASE("gpt_oss: the flavour's parameters, their shapes and dtypes", "[gpt_oss]") {
  ModelConfig c = tiny_gpt_oss();
  c.dtype = DType::bf16;
  c.resolve();
  const Flavour f = flavour_of(c);
  CHECK(f.activation == nn::Activation::swiglu_clamped);
  CHECK(f.bias);
  CHECK(f.sinks);
  CHECK(f.router_logit_bias);
  CHECK(f.normalize_topk);
  CHECK_FALSE(f.tied_head);
  CHECK_FALSE(f.learned_positions);
  ParamSet ps(3, DType::bf16);
  const Transformer model(c, ps);
  const int64_t D = 32, H = 4, KV = 2, hd = 12, F = 16, E = 4;
  auto shape_of = [&](const std::string& name, DType dtype) {
    INFO(name);
    const Param* p = std::as_const(ps).find(name);
    REQUIRE(p != nullptr);
    CHECK(p->value.dtype() == dtype);
    return p->value.shape();
  };
  for (int64_t i = 0; i < 3; ++i) {
    const std::string b = "blocks." + std::to_string(i);
    CHECK(shape_of(b + ".attn.q.weight", DType::bf16) == Shape{H * hd, D});
    CHECK(shape_of(b + ".attn.q.bias", DType::bf16) == Shape{H * hd});
    CHECK(shape_of(b + ".attn.k.bias", DType::bf16) == Shape{KV * hd});
    CHECK(shape_of(b + ".attn.v.bias", DType::bf16) == Shape{KV * hd});
    CHECK(shape_of(b + ".attn.o.weight", DType::bf16) == Shape{D, H * hd});
    CHECK(shape_of(b + ".attn.o.bias", DType::bf16) == Shape{D});
    CHECK(shape_of(b + ".attn.sinks", DType::f32) == Shape{H});  // f32 in a bf16 model
    CHECK(shape_of(b + ".moe.router.weight", DType::bf16) == Shape{E, D});
    CHECK(shape_of(b + ".moe.router.logit_bias", DType::bf16) == Shape{E});
    CHECK(shape_of(b + ".moe.experts.w1", DType::bf16) == Shape{E, F, D});
    CHECK(shape_of(b + ".moe.experts.w3", DType::bf16) == Shape{E, F, D});
    CHECK(shape_of(b + ".moe.experts.w2", DType::bf16) == Shape{E, D, F});
    CHECK(shape_of(b + ".moe.experts.b1", DType::bf16) == Shape{E, F});
    CHECK(shape_of(b + ".moe.experts.b3", DType::bf16) == Shape{E, F});
    CHECK(shape_of(b + ".moe.experts.b2", DType::bf16) == Shape{E, D});
    // No selection bias (softmax router), no dense MLP, no shared expert, no qk-norm.
    for (const char* absent : {".moe.router.bias", ".mlp.w1.weight", ".moe.shared.w1.weight",
                               ".attn.q_norm.weight", ".norm1.bias"})
      CHECK(std::as_const(ps).find(b + absent) == nullptr);
  }
  CHECK(std::as_const(ps).find("lm_head.weight") != nullptr);  // untied
  // The sinks are trained, without weight decay.
  const Param* sinks = std::as_const(ps).find("blocks.0.attn.sinks");
  CHECK_FALSE(sinks->frozen);
  CHECK_FALSE(sinks->decay);
}

TEST_CASE("gpt_oss: the config's JSON round trip, alpha and limit included", "[gpt_oss]") {
  ModelConfig c = tiny_gpt_oss();
  c.swiglu_alpha = 1.25, c.swiglu_limit = 0.5;
  c.resolve();
  const nlohmann::json j = to_json(c);
  CHECK(j.at("arch") == "gpt_oss");
  CHECK(j.at("swiglu_alpha").get<double>() == 1.25);
  CHECK(j.at("swiglu_limit").get<double>() == 0.5);
  const ModelConfig back = model_config_from_json(j);
  CHECK(back.arch == Arch::gpt_oss);
  CHECK(back.swiglu_alpha == 1.25);
  CHECK(back.swiglu_limit == 0.5);
  CHECK(back.head_dim_resolved() == 12);
  CHECK(back.window_layers == std::vector<int64_t>{0, 2});
  CHECK(back.yarn.truncate == false);
  CHECK(to_json(back) == j);
  // Without the keys (a file written before they were set): HF's defaults, 1.702 and 7.
  nlohmann::json old = j;
  old.erase("swiglu_alpha");
  old.erase("swiglu_limit");
  const ModelConfig defaults = model_config_from_json(old);
  CHECK(defaults.swiglu_alpha == 1.702);
  CHECK(defaults.swiglu_limit == 7.0);
  // The other families' files do not carry them.
  ModelConfig mixtral = tiny_gpt_oss();
  mixtral.arch = Arch::mixtral;
  mixtral.resolve();
  CHECK_FALSE(to_json(mixtral).contains("swiglu_alpha"));
  CHECK_FALSE(to_json(mixtral).contains("swiglu_limit"));
  CHECK(std::string(arch_name(Arch::gpt_oss)) == "gpt_oss");
  CHECK(parse_arch("gpt_oss") == Arch::gpt_oss);
}

TEST_CASE("gpt_oss: bad settings are refused by name", "[gpt_oss]") {
  REQUIRE_THAT(test::error_of([] { parse_arch("gpt-oss"); }),
               Catch::Contains("unknown --arch 'gpt-oss'") && Catch::Contains("gpt_oss"));
  auto error_for = [](const std::function<void(ModelConfig&)>& change) {
    ModelConfig c = tiny_gpt_oss();
    change(c);
    return test::error_of([&] { c.resolve(); });
  };
  CHECK(error_for([](ModelConfig&) {}) == "(no error)");
  CHECK_THAT(error_for([](ModelConfig& c) { c.swiglu_alpha = 0; }),
             Catch::Contains("--swiglu-alpha") && Catch::Contains("finite number > 0"));
  CHECK_THAT(error_for([](ModelConfig& c) { c.swiglu_alpha = std::nan(""); }),
             Catch::Contains("--swiglu-alpha"));
  CHECK_THAT(error_for([](ModelConfig& c) { c.swiglu_limit = -1; }),
             Catch::Contains("--swiglu-limit") && Catch::Contains("(got -1)"));
  CHECK_THAT(error_for([](ModelConfig& c) { c.swiglu_limit = INFINITY; }),
             Catch::Contains("--swiglu-limit"));
  CHECK_THAT(error_for([](ModelConfig& c) { c.swiglu_limit = 1e39; }),
             Catch::Contains("--swiglu-limit"));
  // Another family would ignore them: refused, naming the flags and the family.
  CHECK_THAT(error_for([](ModelConfig& c) {
               c.arch = Arch::mixtral;
               c.swiglu_alpha = 2;
             }),
             Catch::Contains("--swiglu-alpha and --swiglu-limit are gpt_oss's") &&
                 Catch::Contains("--arch mixtral"));
  CHECK_THAT(error_for([](ModelConfig& c) {
               c.arch = Arch::qwen3_moe;
               c.swiglu_limit = 6;
             }),
             Catch::Contains("qwen3_moe"));
  // Its clamped SwiGLU is an expert activation: no dense layers, no shared or residual MLP.
  CHECK_THAT(error_for([](ModelConfig& c) { c.moe_every = 2; }),
             Catch::Contains("gpt_oss has experts in every layer; layer 0 is dense") &&
                 Catch::Contains("--moe-every 1"));
  CHECK_THAT(error_for([](ModelConfig& c) { c.shared_expert_ff = 8; }),
             Catch::Contains("gpt_oss has no --shared-expert-ff"));
  CHECK_THAT(error_for([](ModelConfig& c) { c.residual_moe = true; }),
             Catch::Contains("gpt_oss has no --residual-moe"));
  CHECK_THAT(error_for([](ModelConfig& c) { c.qkv_bias = true; }),
             Catch::Contains("glm4_moe's options"));
  // A checkpoint's file with a bad value: the same words.
  ModelConfig c = tiny_gpt_oss();
  c.resolve();
  nlohmann::json j = to_json(c);
  j["swiglu_limit"] = 0.0;
  CHECK_THAT(test::error_of([&] { model_config_from_json(j); }), Catch::Contains("--swiglu-limit"));
}

// Exact: every count is an integer far below 2^53. The sinks are f32 in a 16-bit model.
TEST_CASE("gpt_oss: param_counts equal the ParamSet's", "[gpt_oss][plan]") {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    ModelConfig c = tiny_gpt_oss();
    c.dtype = dtype;
    c.resolve();
    INFO(dtype_name(dtype));
    ParamSet ps(1, dtype);
    ps.skip_initial_values(true);
    const Transformer model(c, ps);
    double total = 0, dense = 0, expert = 0, bytes = 0, sinks = 0;
    for (const Param* p : std::as_const(ps).all()) {
      const double n = double(p->logical_numel());
      total += n;
      (p->expert ? expert : dense) += n;
      bytes += double(p->value.nbytes());
      if (p->name.find(".sinks") != std::string::npos) sinks += n;
    }
    const plan::ParamCounts p = plan::param_counts(c);
    CHECK(total == double(model.num_params()));
    CHECK(p.total() == total);
    CHECK(p.dense == dense);
    CHECK(p.per_expert * double(p.experts) == expert);
    CHECK(p.f32_trained == sinks);
    CHECK(sinks == 3 * 4);  // H a layer
    CHECK(p.frozen == 0);
    CHECK(p.value_bytes(dtype) == bytes);
  }
}

// Each of the family's features reaches the logits: zeroing the sinks, the router's logit bias,
// the attention's biases or the experts' biases, or changing alpha or the limit, moves them by far
// more than rounding (each value of O(1) logits, f32: a change below 1e-3 would be no change).
TEST_CASE("gpt_oss: sinks, router bias, biases, alpha and limit each move the logits",
          "[gpt_oss]") {
  ModelConfig c = tiny_gpt_oss();
  c.swiglu_limit = 0.5;  // the clamps bite on values of O(1)
  c.resolve();
  ParamSet ps(7);
  const Transformer model(c, ps);
  randomise(ps);
  const Tensor ids = Tensor::from_vector({1, c.seq}, ids_of(c.seq, 40, 7));
  const Tensor base = model.logits(ids);
  auto moved_without = [&](const std::string& suffix) {
    ParamSet changed(1);
    const Transformer copy(c, changed);
    for (Param* p : changed.all()) {
      p->value.copy_from(std::as_const(ps).find(p->name)->value);
      if (p->name.size() >= suffix.size() &&
          p->name.compare(p->name.size() - suffix.size(), suffix.size(), suffix) == 0)
        p->value.fill(0.0f);
      p->refresh_compute();
    }
    return max_abs_diff(copy.logits(ids), base);
  };
  for (const char* suffix :
       {".attn.sinks", ".moe.router.logit_bias", ".attn.o.bias", ".attn.k.bias", ".moe.experts.b1",
        ".moe.experts.b3", ".moe.experts.b2"}) {
    INFO(suffix);
    CHECK(moved_without(suffix) > 1e-3);
  }
  ModelConfig alpha = c, limit = c;
  alpha.swiglu_alpha = 1.0;
  limit.swiglu_limit = 7.0;
  CHECK(max_abs_diff(logits_with(alpha, ps, ids), base) > 1e-3);
  CHECK(max_abs_diff(logits_with(limit, ps, ids), base) > 1e-3);
  CHECK(max_abs_diff(logits_with(c, ps, ids), base) == 0.0);  // the copy itself changes nothing
}

// Central differences of the evaluated total loss, as the other families' whole-model checks
// (test_mla.cpp): top_k = E so that no perturbation changes which experts a token takes, and a
// limit far above the activations so that no perturbation crosses a clamp's kink (the clamps'
// gradients are test_clamped_swiglu.cpp's); aux and z losses weighted in. Step 3e-3, not 1e-2:
// with weights drawn at 0.4 the loss is curved enough in block 0's norm weights that the step's
// truncation error (quadratic in it) is 3e-2 of the gradient's scale at 1e-2, 3.2e-3 at 3e-3 and
// 2e-4 at 1e-3 (measured), while f32 rounding of the loss (~1e-6) over 2 * 3e-3 stays ~2e-4. The
// largest error seen at 3e-3 is 7e-3; tolerance 2e-2 (a wrong term is O(1) of the scale).
TEST_CASE("gpt_oss: the whole model's gradient matches finite differences",
          "[gpt_oss][gradcheck]") {
  ModelConfig c = tiny_gpt_oss();
  c.layers = 2, c.window_layers = {0}, c.seq = 7, c.top_k = 4, c.swiglu_limit = 1e3;
  c.aux_loss_coef = 0.5, c.z_loss_coef = 0.1;
  c.resolve();
  ParamSet ps(5);
  Transformer model(c, ps);
  randomise(ps);
  const Tensor ids = test::random_ids({2, c.seq}, 1, int32_t(c.vocab_size));
  const Tensor targets = test::random_ids({2, c.seq}, 2, int32_t(c.vocab_size));
  nn::RouterStep step;
  step.training = false;
  ps.zero_grad();
  model.forward_backward(ids, targets, step);
  for (Param* p : ps.all()) {
    DYNAMIC_SECTION(p->name) {
      Tensor analytic = p->grad.clone();
      auto loss = [&] {
        p->refresh_compute();
        return model.evaluate(ids, targets).total;
      };
      MOE_REQUIRE_GRAD(test::check_gradient(p->value, analytic, loss, 3e-3, 12), 2e-2);
      p->refresh_compute();
    }
  }
}

// Ten AdamW steps on one batch at lr 1e-2 (memorising it): the loss is finite at every step and
// ends well below where it began; every trained parameter, the family's own included, has a
// non-zero gradient at the first step.
TEST_CASE("gpt_oss: training steps give a finite loss that falls", "[gpt_oss][train]") {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dtype));
    ModelConfig c = tiny_gpt_oss();
    c.dtype = dtype;
    c.resolve();
    ParamSet ps(11, dtype);
    Transformer model(c, ps);
    optim::AdamW opt(ps, optim::AdamWConfig{});
    const Tensor ids = test::random_ids({2, c.seq}, 3, int32_t(c.vocab_size));
    const Tensor targets = test::random_ids({2, c.seq}, 4, int32_t(c.vocab_size));
    nn::RouterStep step;
    std::vector<double> losses;
    for (int s = 0; s < 10; ++s) {
      ps.zero_grad();
      const ForwardStats st = model.forward_backward(ids, targets, step);
      REQUIRE(std::isfinite(st.total));
      losses.push_back(st.loss);
      if (s == 0)
        for (const Param* p : std::as_const(ps).all()) {
          INFO(p->name);
          double g = 0;
          for (float x : p->grad.to_vector()) g = std::max(g, double(std::fabs(x)));
          CHECK(g > 0);
        }
      opt.step(1e-2f);
    }
    INFO("loss " << losses.front() << " -> " << losses.back());
    CHECK(losses.back() < losses.front() - 0.5);
  }
}

// Prefill of 3 tokens, then one token a step through the cache, against the logits of the whole
// sequence at once: T 12 reaches past the window of 4 on layers 0 and 2 and past YaRN's original
// context of 8. The decode computes the same f32 sums in another order (attention by blocks of
// the cache, the experts' GEMMs on one row instead of twelve), each within a few ulps (~1e-7);
// with every weight drawn at 0.4 (20x the init scale) each of the 3 blocks amplifies such a
// difference by its Jacobian's norm, O(10): measured 1e-6 to 1.5e-5 of the largest logit over the
// positions (the largest at position 10), the same order with YaRN or the windows off. Bound 5e-5
// of it; a wrong mask, sink, RoPE position or slot moves the logits by O(0.1) (the windows alone
// by more than 1e-3, checked below).
TEST_CASE("gpt_oss: cached decode equals the uncached forward", "[gpt_oss][decode]") {
  ModelConfig c = tiny_gpt_oss();
  c.resolve();
  ParamSet ps(13);
  const Transformer model(c, ps);
  randomise(ps);
  const int64_t T = c.seq, V = c.vocab_size;
  const std::vector<int32_t> all = ids_of(T, int32_t(V), 11);
  const Tensor ids = Tensor::from_vector({1, T}, all);
  const Tensor full = model.logits(ids);
  KVCache cache = model.make_cache(1);
  model.forward_cached(
      Tensor::from_vector({1, 3}, std::vector<int32_t>(all.begin(), all.begin() + 3)), cache);
  for (int64_t t = 3; t < T; ++t) {
    const Tensor logits =
        model.forward_cached(Tensor::from_vector({1, 1}, std::vector<int32_t>{all[t]}), cache);
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < V; ++i) {
      const double want = full.data<float>()[t * V + i];
      diff = std::max(diff, std::fabs(double(logits.data<float>()[i]) - want));
      scale = std::max(scale, std::fabs(want));
    }
    INFO("position " << t << ": " << diff << " of " << scale);
    CHECK(diff <= 5e-5 * scale);
  }
  // The windows matter here: without them the same weights give other logits past position 3.
  ModelConfig unwindowed = c;
  unwindowed.sliding_window = 0;
  unwindowed.window_layers.clear();
  CHECK(max_abs_diff(logits_with(unwindowed, ps, ids), full) > 1e-3);
}
