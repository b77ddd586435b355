// Multi-head Latent Attention (DeepSeek-V2/V3, issue 44): the layer against a double reference
// written from the published math (tests/support/hf_deepseek_v3.h, on tensors named and laid out
// as transformers' DeepseekV3Attention has them), the cached forward against the full one, the
// layer's and a whole deepseek_v3 model's gradients by finite differences, and ModelConfig's
// latent-attention fields (saved, loaded, refused by name). Shape letters as in the support file.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "moe/models/memory.h"
#include "moe/models/transformer.h"
#include "moe/nn/attention.h"
#include "moe/rng.h"
#include "support/bits.h"
#include "support/hf_deepseek_v3.h"
#include "support/run.h"

using namespace moe;
using namespace moe::nn;
using test::dsv3::MlaShape;

namespace {

struct Variant {
  std::string name;
  MlaShape shape;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  v.push_back({"q latent, values narrower than keys", MlaShape{}});
  MlaShape plain;  // DeepSeek-V2-Lite: q_proj, no q latent
  plain.r = 0;
  plain.dv = 8;  // values as wide as keys: no padding
  v.push_back({"plain q projection, values as wide as keys", plain});
  MlaShape odd;
  odd.H = 2, odd.dn = 6, odd.dr = 2, odd.dv = 5, odd.c = 5, odd.r = 3;
  v.push_back({"head widths with no common factor but 1", odd});
  return v;
}

AttentionConfig config_of(const MlaShape& s) {
  AttentionConfig c;
  c.d_model = s.D;
  c.heads = s.H;
  c.rope = true;
  c.rope_theta = float(s.theta);
  c.norm_eps = float(s.eps);
  c.mla = test::dsv3::mla_config(s);
  return c;
}

// max |ours - reference| / max |reference| (the reference far from 0, so the check has teeth).
double relative_error(const Tensor& ours, const std::vector<double>& ref) {
  const std::vector<float> a = ours.to_vector();
  REQUIRE(a.size() == ref.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  REQUIRE(scale > 0.05);
  return diff / scale;
}

}  // namespace

TEST_CASE("mla: the layer's params and cache follow the latent shape", "[mla][attention]") {
  const MlaShape s;
  ParamSet ps(3);
  Attention attention(ps, "attn", config_of(s));
  CHECK(attention.head_dim() == s.dn + s.dr);
  CHECK(ps.at("attn.q_a.weight").value.shape() == Shape{s.r, s.D});
  CHECK(ps.at("attn.q_a_norm.weight").value.shape() == Shape{s.r});
  CHECK(ps.at("attn.q_b.weight").value.shape() == Shape{s.H * (s.dn + s.dr), s.r});
  CHECK(ps.at("attn.kv_a.weight").value.shape() == Shape{s.c, s.D});
  CHECK(ps.at("attn.k_rope.weight").value.shape() == Shape{s.dr, s.D});
  CHECK(ps.at("attn.kv_a_norm.weight").value.shape() == Shape{s.c});
  CHECK(ps.at("attn.k_b.weight").value.shape() == Shape{s.H * s.dn, s.c});
  CHECK(ps.at("attn.v_b.weight").value.shape() == Shape{s.H * s.dv, s.c});
  CHECK(ps.at("attn.o.weight").value.shape() == Shape{s.D, s.H * s.dv});
  CHECK(ps.size() == 9);
  CHECK(ps.find("attn.q.weight") == nullptr);
  MlaShape plain = s;
  plain.r = 0;
  ParamSet ps2(3);
  Attention plain_attention(ps2, "attn", config_of(plain));
  CHECK(ps2.at("attn.q.weight").value.shape() == Shape{s.H * (s.dn + s.dr), s.D});
  CHECK(ps2.find("attn.q_a.weight") == nullptr);
  CHECK(ps2.size() == 7);
  // The cache holds the latent and the rotated k_pe, not full keys and values
  // (tests/unit/test_mla_cache.cpp).
  CHECK(attention.make_cache(2, 5).latent.shape() == Shape{2, 5, s.c + s.dr});
}

// Two windows of 5 tokens. f32 against double: outputs O(1) from dot products of a few dozen
// terms; 2e-5 of the scale is ~100 ulps, while a wrong RoPE pairing, head, scale or padding moves
// the outputs by O(1).
TEST_CASE("mla: the layer matches the published math", "[mla][attention]") {
  for (const Variant& v : variants()) {
    INFO(v.name);
    const MlaShape& s = v.shape;
    ParamSet ps(4);
    Attention attention(ps, "attn", config_of(s));
    const test::dsv3::Weights w = test::dsv3::mla_weights(s, 7);
    test::dsv3::load_mla(ps, "attn", s, w);
    const int64_t B = 2, T = 5;
    const Tensor x = test::random_tensor({B * T, s.D}, 11);
    const std::vector<float> xf = x.to_vector();
    const std::vector<double> ref =
        test::dsv3::mla_reference(s, w, std::vector<double>(xf.begin(), xf.end()), B, T);
    CHECK(relative_error(attention.forward(x, B, T, nullptr), ref) < 2e-5);
    Attention::Saved saved;
    CHECK(relative_error(attention.forward(x, B, T, &saved), ref) < 2e-5);
  }
}

// A prefill of 3 tokens then single tokens, in slot 1 of 2, against the full forward.
TEST_CASE("mla: the cached forward equals the full forward", "[mla][attention]") {
  for (const Variant& v : variants()) {
    INFO(v.name);
    const MlaShape& s = v.shape;
    ParamSet ps(4);
    Attention attention(ps, "attn", config_of(s));
    test::dsv3::load_mla(ps, "attn", s, test::dsv3::mla_weights(s, 8));
    const int64_t T = 6;
    const Tensor x = test::random_tensor({T, s.D}, 12);
    const Tensor full = attention.forward(x, 1, T, nullptr);
    AttentionCache cache = attention.make_cache(2, T);
    const Tensor prefill =
        attention.forward_cached(x.rows(0, 3), ops::CachedRows{{1}, {0}, {3}}, cache);
    std::vector<float> got = prefill.to_vector();
    for (int64_t t = 3; t < T; ++t) {
      const Tensor step =
          attention.forward_cached(x.rows(t, t + 1).clone(), ops::CachedRows{{1}, {t}, {1}}, cache);
      const std::vector<float> one = step.to_vector();
      got.insert(got.end(), one.begin(), one.end());
    }
    const std::vector<float> want = full.to_vector();
    std::vector<double> want_d(want.begin(), want.end());
    CHECK(relative_error(Tensor::from_vector({T, s.D}, got), want_d) < 1e-5);
  }
}

TEST_CASE("mla: the layer's gradients match finite differences", "[mla][attention][gradcheck]") {
  for (const Variant& v : variants()) {
    const MlaShape& s = v.shape;
    ParamSet ps(5);
    Attention attention(ps, "attn", config_of(s));
    test::dsv3::load_mla(ps, "attn", s, test::dsv3::mla_weights(s, 9));
    const int64_t B = 2, T = 4;
    Tensor x = test::random_tensor({B * T, s.D}, 13);
    const Tensor r = test::random_tensor({B * T, s.D}, 14);
    Attention::Saved saved;
    ps.zero_grad();
    const Tensor y = attention.forward(x, B, T, &saved);
    const Tensor dx = attention.backward(r, saved);
    auto loss = [&] { return test::dot(attention.forward(x, B, T, nullptr), r); };
    DYNAMIC_SECTION(v.name << ": x") {
      MOE_REQUIRE_GRAD(test::check_gradient(x, dx, loss, 1e-2, 24), 1e-2);
    }
    for (Param* p : ps.all()) {
      DYNAMIC_SECTION(v.name << ": " << p->name) {
        Tensor analytic = p->grad.clone();
        auto param_loss = [&] {
          p->refresh_compute();
          return loss();
        };
        MOE_REQUIRE_GRAD(test::check_gradient(p->value, analytic, param_loss, 1e-2, 24), 1e-2);
        p->refresh_compute();
      }
    }
  }
}

namespace {

ModelConfig tiny_deepseek() {
  ModelConfig c;
  c.arch = Arch::deepseek_v3;
  c.vocab_size = 11, c.layers = 2, c.d_model = 10, c.heads = 2, c.seq = 5;
  c.q_lora_rank = 6, c.kv_lora_rank = 4, c.qk_nope_dim = 4, c.qk_rope_dim = 2, c.v_head_dim = 3;
  c.d_ff = 6, c.dense_ff = 10, c.shared_expert_ff = 6;
  c.experts = 4, c.moe_every = 2, c.top_k = 4;  // k = E: the choice is fixed under perturbation
  c.normalize_topk = true;
  c.router_scoring = nn::RouterScoring::sigmoid;
  c.router_groups = 2, c.router_group_topk = 2, c.routed_scale = 2.5;
  c.aux_loss_coef = 0.5, c.z_loss_coef = 0.1;
  return c;
}

}  // namespace

TEST_CASE("deepseek_v3: the whole model's gradient matches finite differences",
          "[mla][deepseek_v3][gradcheck]") {
  ModelConfig c = tiny_deepseek();
  c.resolve();
  ParamSet ps(5);
  Transformer model(c, ps);
  REQUIRE(ps.find("blocks.1.attn.kv_a.weight") != nullptr);
  REQUIRE(ps.find("blocks.1.attn.k.weight") == nullptr);
  Tensor ids = test::random_ids({2, c.seq}, 1, int32_t(c.vocab_size));
  Tensor targets = test::random_ids({2, c.seq}, 2, int32_t(c.vocab_size));
  for (Param* p : ps.all()) {
    if (p->name.find("norm") != std::string::npos || p->frozen) continue;
    p->value.copy_from(test::random_tensor(p->value.shape(), hash_name(p->name), 0.4f));
    p->refresh_compute();
  }
  nn::RouterStep step;
  step.training = false;
  ps.zero_grad();
  model.forward_backward(ids, targets, step);
  for (Param* p : ps.all()) {
    if (p->frozen) continue;
    DYNAMIC_SECTION(p->name) {
      Tensor analytic = p->grad.clone();
      auto loss = [&] {
        p->refresh_compute();
        return model.evaluate(ids, targets).total;
      };
      MOE_REQUIRE_GRAD(test::check_gradient(p->value, analytic, loss, 1e-2, 12), 2e-2);
      p->refresh_compute();
    }
  }
}

TEST_CASE("deepseek_v3: the latent shape is saved, loaded and checked", "[mla][deepseek_v3]") {
  ModelConfig c = tiny_deepseek();
  c.resolve();
  const nlohmann::json j = to_json(c);
  const ModelConfig back = model_config_from_json(j);
  CHECK(back.arch == Arch::deepseek_v3);
  CHECK(back.q_lora_rank == 6);
  CHECK(back.kv_lora_rank == 4);
  CHECK(back.qk_nope_dim == 4);
  CHECK(back.qk_rope_dim == 2);
  CHECK(back.v_head_dim == 3);
  CHECK(to_json(back) == j);

  // A checkpoint written before these keys reads as it did: no latent attention.
  ModelConfig glm = tiny_deepseek();
  glm.arch = Arch::glm4_moe;
  glm.q_lora_rank = glm.kv_lora_rank = glm.qk_nope_dim = glm.qk_rope_dim = glm.v_head_dim = 0;
  glm.head_dim = 4;
  glm.resolve();
  nlohmann::json old = to_json(glm);
  for (const char* key :
       {"q_lora_rank", "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim"})
    old.erase(key);
  CHECK_FALSE(model_config_from_json(old).mla());

  auto refusal = [](ModelConfig m) { return test::error_of([&] { m.resolve(); }); };
  ModelConfig no_latent = tiny_deepseek();
  no_latent.kv_lora_rank = 0;
  CHECK_THAT(refusal(no_latent),
             Catch::Contains("--kv-lora-rank must be >= 1 with --arch deepseek_v3 (got 0)"));
  ModelConfig latent_glm = tiny_deepseek();
  latent_glm.arch = Arch::glm4_moe;
  CHECK_THAT(refusal(latent_glm),
             Catch::Contains("--q-lora-rank is deepseek_v3's, not glm4_moe's"));
  ModelConfig odd_rope = tiny_deepseek();
  odd_rope.qk_rope_dim = 3;
  CHECK_THAT(
      refusal(odd_rope),
      Catch::Contains("--qk-rope-dim must be even and >= 2: RoPE turns pairs of features (got 3)"));
  ModelConfig wide_v = tiny_deepseek();
  wide_v.v_head_dim = 7;
  CHECK_THAT(refusal(wide_v),
             Catch::Contains(
                 "--v-head-dim must be between 1 and --qk-nope-dim + --qk-rope-dim = 6 (got 7)"));
  ModelConfig gqa = tiny_deepseek();
  gqa.kv_heads = 1;
  CHECK_THAT(refusal(gqa), Catch::Contains("--kv-heads does not apply to --arch deepseek_v3"));
  nlohmann::json bad = j;
  bad["kv_lora_rank"] = -2;
  CHECK_THAT(test::error_of([&] { model_config_from_json(bad); }),
             Catch::Contains("--kv-lora-rank must be >= 1 with --arch deepseek_v3 (got -2)"));
  bad = j;
  bad["q_lora_rank"] = -1;
  CHECK_THAT(test::error_of([&] { model_config_from_json(bad); }),
             Catch::Contains("--q-lora-rank must be >= 0 (0 = a plain q projection; got -1)"));
}

// The memory checks size a model by parameter_lower_bound: with latent attention it must count
// the latent projections (the q/k/v/o formula of the other families counted 4 D H hd a block,
// 3.7 times DeepSeek-V3's real attention, and would refuse models that fit).
TEST_CASE("deepseek_v3: the parameter bound counts the latent attention", "[mla][deepseek_v3]") {
  ModelConfig c;
  c.arch = Arch::deepseek_v3;
  c.vocab_size = 32, c.layers = 2, c.d_model = 64, c.heads = 8, c.seq = 8;
  c.q_lora_rank = 16, c.kv_lora_rank = 8, c.qk_nope_dim = 16, c.qk_rope_dim = 8, c.v_head_dim = 8;
  c.d_ff = 8, c.experts = 2, c.moe_every = 2, c.top_k = 1;
  c.router_scoring = nn::RouterScoring::sigmoid;
  for (int64_t q_lora : {int64_t{16}, int64_t{0}}) {
    c.q_lora_rank = q_lora;
    c.resolve();
    ParamSet ps(1);
    Transformer model(c, ps);
    double actual = 0, norms = 0;
    for (const Param* p : std::as_const(ps).all()) {
      actual += double(p->value.numel());
      if (p->value.ndim() == 1) norms += double(p->value.numel());  // norms, the router bias
    }
    const double bound = parameter_lower_bound(c, 1, 1);
    INFO("q_lora_rank " << q_lora << ": bound " << bound << ", parameters " << actual);
    CHECK(bound <= actual);
    CHECK(bound >= actual - norms);
  }
}
