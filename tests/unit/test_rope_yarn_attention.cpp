// YaRN through the attention layer (nn/attention.h rope_scaling, score_scale): the uncached
// forward of a latent-attention layer against the double reference of hf_deepseek_v3.h (YaRN's
// ramp, attention factor and DeepSeek's softmax mscale), and the decode paths (the latent cache
// of nn/attention_latent.cpp, the plain K/V cache) equal to the uncached forward with YaRN on.
// Shape letters: T sequence, D model width, H heads.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "moe/nn/attention.h"
#include "moe/param.h"
#include "support/hf_deepseek_v3.h"

using namespace moe;
using namespace moe::nn;

namespace {

// max |a - b| / max |b|
double relative_error(const std::vector<float>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  REQUIRE(scale > 0.05);
  return diff / scale;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// The YaRN of the reference shape s as the layer takes it (what ModelConfig derives).
AttentionConfig yarn_config(const test::dsv3::MlaShape& s) {
  AttentionConfig c;
  c.d_model = s.D, c.heads = s.H, c.rope = true, c.rope_theta = float(s.theta);
  c.norm_eps = float(s.eps);
  c.mla = test::dsv3::mla_config(s);
  ops::YarnSettings y;
  y.factor = s.yarn.factor, y.original_ctx = s.yarn.original;
  y.mscale = s.yarn.mscale, y.mscale_all_dim = s.yarn.mscale_all_dim;
  c.rope_scaling = ops::yarn_scaling(y, s.theta, s.dr);
  c.score_scale = float(s.yarn.score_gain());
  return c;
}

// The layer's outputs for x [T, D] fed one token at a time through its cache (slot 0).
std::vector<float> decoded(const Attention& attention, const Tensor& x, int64_t T) {
  AttentionCache cache = attention.make_cache(1, T);
  std::vector<float> out;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> y =
        attention.forward_cached(x.rows(t, t + 1).clone(), {{0}, {t}, {1}}, cache).to_vector();
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

}  // namespace

TEST_CASE("yarn attention: latent attention forward and latent decode match the reference",
          "[rope][yarn][mla]") {
  // 4 pairs rotated, factor 4 over 64 original positions: at theta 50 the ramp runs over pairs
  // 0..3 (r = 0, 1/3, 2/3, 1: 8 ln(64 / 2 pi) / (2 ln 50) = 2.37, ceiled to 3); attention factor
  // m(0.8)/m(1.2) and softmax scale m(1.2)^2 (m(x) = 0.1 x ln 4 + 1).
  test::dsv3::MlaShape s;
  s.dr = 8;
  s.yarn = {4.0, 64.0, 32.0, 1.0, 0.8, 1.2};
  const AttentionConfig c = yarn_config(s);
  REQUIRE(c.rope_scaling.ramp_low == 0.0f);
  REQUIRE(c.rope_scaling.ramp_width == 3.0f);
  ParamSet ps(4);
  Attention attention(ps, "attn", c);
  const auto w = test::dsv3::mla_weights(s, 31);
  test::dsv3::load_mla(ps, "attn", s, w);
  const int64_t T = 12;
  const Tensor x = test::random_tensor({T, s.D}, 32);
  const std::vector<double> want = test::dsv3::mla_reference(s, w, widen(x.to_vector()), 1, T);
  // f32 layer against the double reference: sums of <= 16 products of O(1) values, 1e-5.
  CHECK(relative_error(attention.forward(x, 1, T, nullptr).to_vector(), want) < 1e-5);
  // The latent cache decodes the same (its scores through the absorbed projections).
  CHECK(relative_error(decoded(attention, x, T), want) < 1e-5);
  // Without YaRN the same weights give another output: the check above can fail.
  test::dsv3::MlaShape plain = s;
  plain.yarn = {};
  const std::vector<double> other = test::dsv3::mla_reference(plain, w, widen(x.to_vector()), 1, T);
  CHECK(relative_error(attention.forward(x, 1, T, nullptr).to_vector(), other) > 1e-3);
}

TEST_CASE("yarn attention: plain attention's K/V cache decodes as its forward", "[rope][yarn]") {
  AttentionConfig c;
  c.d_model = 16, c.heads = 4, c.kv_heads = 2, c.rope = true, c.rope_theta = 500.0f;
  c.init_std = c.out_init_std = 0.4f;  // outputs of O(1): a relative error that means something
  ops::YarnSettings y;
  y.factor = 8, y.original_ctx = 32, y.truncate = false;  // gpt-oss's kind: fractional range
  c.rope_scaling = ops::yarn_scaling(y, 500, 4);
  ParamSet ps(41);  // random initial weights
  Attention attention(ps, "attn", c);
  const int64_t T = 9;
  const Tensor x = test::random_tensor({T, 16}, 42);
  const std::vector<float> full = attention.forward(x, 1, T, nullptr).to_vector();
  CHECK(relative_error(decoded(attention, x, T), widen(full)) < 1e-5);
}

TEST_CASE("yarn attention: the latent layer's gradients with YaRN match finite differences",
          "[rope][yarn][mla][gradcheck]") {
  // The backward rotates by (a R)^T and multiplies dq by the softmax factor (q is saved scaled).
  test::dsv3::MlaShape s;
  s.dr = 8;
  s.yarn = {4.0, 64.0, 32.0, 1.0, 0.8, 1.2};
  ParamSet ps(5);
  Attention attention(ps, "attn", yarn_config(s));
  test::dsv3::load_mla(ps, "attn", s, test::dsv3::mla_weights(s, 9));
  const int64_t B = 2, T = 4;
  Tensor x = test::random_tensor({B * T, s.D}, 13);
  const Tensor r = test::random_tensor({B * T, s.D}, 14);
  Attention::Saved saved;
  ps.zero_grad();
  attention.forward(x, B, T, &saved);
  const Tensor dx = attention.backward(r, saved);
  auto loss = [&] { return test::dot(attention.forward(x, B, T, nullptr), r); };
  SECTION("x") { MOE_REQUIRE_GRAD(test::check_gradient(x, dx, loss, 1e-2, 24), 1e-2); }
  for (Param* p : ps.all()) {
    DYNAMIC_SECTION(p->name) {
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
