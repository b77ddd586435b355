// The attention features of the HF families (issue 21), at the layer and through whole models:
// head_dim != D / H (Qwen3-MoE), q/k/v biases without an o bias (Qwen2-MoE), qk-norm per head
// (Qwen3-MoE) and full width (OLMoE) against a reference written from the published math, the
// parameters each creates, the cached (incremental) forward equal to the full forward, and bad
// configurations refused by name. Gradients are checked in tests/gradcheck/test_dense_layers.cpp.
// Shape letters: T sequence, D model width, H query heads, KV kv heads, hd head dim, V vocabulary.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "moe/models/transformer.h"
#include "moe/nn/attention.h"
#include "moe/param.h"
#include "moe/rng.h"
#include "support/bits.h"
#include "support/gradcheck.h"
#include "support/models.h"

using namespace moe;
using namespace moe::nn;

namespace {

struct Variant {
  std::string name;
  AttentionConfig config;
};

AttentionConfig base_config() {
  AttentionConfig c;
  c.d_model = 16;
  c.heads = 4;
  c.kv_heads = 2;
  c.rope = true;
  c.rope_theta = 100.0f;
  return c;
}

std::vector<Variant> variants() {
  std::vector<Variant> v;
  v.push_back({"head_dim == D / H", base_config()});
  AttentionConfig wide = base_config();
  wide.head_dim = 6;  // H*hd 24 > D 16, as Qwen3-30B-A3B (D 2048, H 32, hd 128)
  v.push_back({"head_dim 6 > D / H", wide});
  AttentionConfig narrow = base_config();
  narrow.head_dim = 2;
  narrow.kv_heads = 1;
  v.push_back({"head_dim 2 < D / H, one kv head", narrow});
  AttentionConfig head_norm = wide;
  head_norm.qk_norm = QkNorm::head;
  v.push_back({"per-head qk-norm, head_dim 6", head_norm});
  AttentionConfig full_norm = base_config();
  full_norm.qk_norm = QkNorm::full;
  v.push_back({"full-width qk-norm", full_norm});
  AttentionConfig biases = base_config();
  biases.qkv_bias = true;
  v.push_back({"q/k/v biases, no o bias", biases});
  AttentionConfig all = head_norm;
  all.qkv_bias = true;
  v.push_back({"biases, per-head qk-norm, head_dim 6", all});
  return v;
}

// Every parameter drawn afresh (norm weights and biases away from 1 and 0).
void randomize(ParamSet& ps, uint64_t seed) {
  for (Param* p : ps.all()) test::randomize_param(*p, seed++, 0.4f);
}

// max |a - b| over rows [0, rows) of a [rows, width] against rows [first, first + rows) of b,
// divided by max |b| over those rows.
double relative_error(const Tensor& a, const Tensor& b, int64_t first) {
  const int64_t width = a.dim(1);
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a.dim(0) * width; ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[first * width + i];
    diff = std::max(diff, std::fabs(x - y));
    scale = std::max(scale, std::fabs(y));
  }
  REQUIRE(scale > 0.01);  // outputs far from zero: the comparison has teeth
  return diff / scale;
}

}  // namespace

TEST_CASE("attention features: q, k, v, o shapes follow head_dim", "[attention]") {
  for (const Variant& v : variants()) {
    INFO(v.name);
    ParamSet ps(3);
    Attention attention(ps, "blocks.0.attn", v.config);
    const int64_t D = v.config.d_model, H = v.config.heads, KV = v.config.kv_heads;
    const int64_t hd = v.config.head_dim ? v.config.head_dim : D / H;
    REQUIRE(attention.head_dim() == hd);
    CHECK(ps.at("blocks.0.attn.q.weight").value.shape() == Shape{H * hd, D});
    CHECK(ps.at("blocks.0.attn.k.weight").value.shape() == Shape{KV * hd, D});
    CHECK(ps.at("blocks.0.attn.v.weight").value.shape() == Shape{KV * hd, D});
    CHECK(ps.at("blocks.0.attn.o.weight").value.shape() == Shape{D, H * hd});
    const size_t biases = v.config.qkv_bias ? 3 : 0;
    CHECK(ps.find("blocks.0.attn.o.bias") == nullptr);
    if (v.config.qkv_bias) {
      CHECK(ps.at("blocks.0.attn.q.bias").value.shape() == Shape{H * hd});
      CHECK(ps.at("blocks.0.attn.k.bias").value.shape() == Shape{KV * hd});
      CHECK(ps.at("blocks.0.attn.v.bias").value.shape() == Shape{KV * hd});
    }
    if (v.config.qk_norm == QkNorm::none) {
      CHECK(ps.size() == 4 + biases);
    } else {
      const bool per_head = v.config.qk_norm == QkNorm::head;
      CHECK(ps.size() == 6 + biases);
      const Param& qn = ps.at("blocks.0.attn.q_norm.weight");
      const Param& kn = ps.at("blocks.0.attn.k_norm.weight");
      CHECK(qn.value.shape() == Shape{per_head ? hd : H * hd});
      CHECK(kn.value.shape() == Shape{per_head ? hd : KV * hd});
      for (const Param* p : {&qn, &kn}) {
        CHECK_FALSE(p->decay);
        for (float w : p->value.to_vector()) CHECK(w == 1.0f);
      }
    }
    AttentionCache cache = attention.make_cache(2, 5);
    CHECK(cache.k.shape() == Shape{2, 5, KV * hd});
  }
}

// A prefill of 4 tokens, then 3 single tokens, through the cache (in slot 1 of 2), against the
// full forward of the 7 tokens. f32 tolerance: each output is a few chains of f32 dot products of
// length <= H*hd (24) whose order differs between a 1-row and a 7-row GEMM; 1e-5 of the scale is
// ~100 ulps, a bug (wrong position, wrong head, a missing norm) moves outputs by O(1).
TEST_CASE("attention features: the cached forward equals the full forward", "[attention]") {
  for (const Variant& v : variants()) {
    INFO(v.name);
    ParamSet ps(4);
    Attention attention(ps, "attn", v.config);
    randomize(ps, 40);
    const int64_t T = 7, D = v.config.d_model;
    Tensor x = test::random_tensor({T, D}, 41);
    const Tensor full = attention.forward(x, 1, T, nullptr);

    // The whole sequence at once: the same products as the full forward, bit for bit.
    AttentionCache whole = attention.make_cache(1, T);
    const Tensor at_once = attention.forward_cached(x, ops::CachedRows{{0}, {0}, {T}}, whole);
    CHECK(test::bitwise_equal(at_once, full));

    AttentionCache cache = attention.make_cache(2, T);
    const Tensor prefill =
        attention.forward_cached(x.rows(0, 4), ops::CachedRows{{1}, {0}, {4}}, cache);
    CHECK(relative_error(prefill, full, 0) <= 1e-5);
    for (int64_t t = 4; t < T; ++t) {
      INFO("position " << t);
      const Tensor step =
          attention.forward_cached(x.rows(t, t + 1).clone(), ops::CachedRows{{1}, {t}, {1}}, cache);
      CHECK(relative_error(step, full, t) <= 1e-5);
    }
    // Slot 0 was never written.
    for (float value : cache.k.rows(0, 1).to_vector()) REQUIRE(value == 0.0f);
  }
}

namespace {

// HF's RMSNorm of one group of n values: y = w * g / sqrt(mean(g^2) + eps), in double.
void rms_normalize(double* g, const float* w, int64_t n, double eps) {
  double sq = 0;
  for (int64_t j = 0; j < n; ++j) sq += g[j] * g[j];
  const double r = 1.0 / std::sqrt(sq / static_cast<double>(n) + eps);
  for (int64_t j = 0; j < n; ++j) g[j] = g[j] * r * w[j];
}

// The queries or keys the layer saved (no RoPE: they are the normed projection) against a double
// reference: proj = x W^T, then RMSNorm of each head's hd values (weight [hd]) or of the whole
// row (weight [heads*hd]). The norm weights are random and eps large (0.5), so a norm over the
// wrong group, a weight indexed per head instead of shared, or the block's eps are all caught.
void check_normed(const Tensor& saved, const Tensor& x, const Param& weight, const Param& norm,
                  int64_t heads, int64_t hd, bool per_head, double eps) {
  const int64_t n = x.dim(0), d = x.dim(1), width = heads * hd;
  REQUIRE(saved.shape() == Shape{n, width});
  const float* w = weight.value.data<float>();
  const float* nw = norm.value.data<float>();
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> row(static_cast<size_t>(width), 0.0);
    for (int64_t o = 0; o < width; ++o)
      for (int64_t j = 0; j < d; ++j) row[o] += double(w[o * d + j]) * x.data<float>()[i * d + j];
    if (per_head) {
      for (int64_t h = 0; h < heads; ++h) rms_normalize(row.data() + h * hd, nw, hd, eps);
    } else {
      rms_normalize(row.data(), nw, width, eps);
    }
    for (int64_t o = 0; o < width; ++o)
      worst = std::max(worst, std::fabs(row[o] - saved.data<float>()[i * width + o]));
  }
  // Outputs O(1) (weights ~0.4, normalised groups): f32 rounding leaves ~1e-6.
  CHECK(worst <= 1e-5);
}

}  // namespace

TEST_CASE("attention features: qk-norm matches the published RMSNorm math", "[attention]") {
  for (QkNorm qk : {QkNorm::head, QkNorm::full}) {
    const bool per_head = qk == QkNorm::head;
    INFO((per_head ? "per head" : "full width"));
    AttentionConfig c = base_config();
    c.head_dim = 6;
    c.rope = false;  // RoPE is checked elsewhere; here q and k as saved are the normed projections
    c.qk_norm = qk;
    c.norm_eps = 0.5f;
    ParamSet ps(6);
    Attention attention(ps, "attn", c);
    randomize(ps, 60);
    Tensor x = test::random_tensor({5, c.d_model}, 61);
    Attention::Saved saved;
    attention.forward(x, 1, 5, &saved);
    check_normed(saved.q, x, ps.at("attn.q.weight"), ps.at("attn.q_norm.weight"), c.heads, 6,
                 per_head, 0.5);
    check_normed(saved.k, x, ps.at("attn.k.weight"), ps.at("attn.k_norm.weight"), c.kv_heads, 6,
                 per_head, 0.5);
  }
}

TEST_CASE("attention features: bad head dimensions are refused by name", "[attention]") {
  ParamSet ps(5);
  AttentionConfig c = base_config();
  c.head_dim = -2;
  REQUIRE_THROWS_WITH(Attention(ps, "blocks.3.attn", c),
                      Catch::Contains("blocks.3.attn") && Catch::Contains("head_dim -2"));
  c.head_dim = 5;  // odd, with RoPE
  REQUIRE_THROWS_WITH(Attention(ps, "blocks.3.attn", c),
                      Catch::Contains("RoPE needs an even head dim (got 5)"));
  c.rope = false;
  REQUIRE_NOTHROW(Attention(ps, "odd.attn", c));
  c.head_dim = 0;
  c.d_model = 10;  // 4 heads do not divide 10 and no head_dim is given
  REQUIRE_THROWS_WITH(Attention(ps, "blocks.3.attn", c),
                      Catch::Contains("must be a multiple of heads 4"));
}

namespace {

// A 2-block model of `arch` with head_dim `hd` (0: D / H), its parameters drawn with noise so
// that norm weights and biases matter.
struct FamilyModel {
  FamilyModel(Arch arch, int64_t hd)
      : config(make_config(arch, hd)), params(17), model(config, params) {
    const uint64_t key = rng_key(17, {0xa77});
    uint64_t index = 0;
    for (Param* p : params.all()) {
      float* d = p->value.data<float>();
      for (int64_t i = 0; i < p->value.numel(); ++i) d[i] += 0.1f * rng_normal(key, index++);
      p->refresh_compute();
    }
  }
  static ModelConfig make_config(Arch arch, int64_t hd) {
    ModelConfig c = test::small_model_config(arch);
    c.vocab_size = 48;
    c.seq = 12;
    c.kv_heads = 2;
    c.head_dim = hd;
    c.resolve();
    return c;
  }
  ModelConfig config;
  ParamSet params;
  Transformer model;
};

}  // namespace

// The families through Transformer::forward_cached (the path moe-infer generate takes): a prefill
// then single tokens, each step's last logits against logits() of the whole sequence.
TEST_CASE("attention features: each family's cached logits equal its full forward", "[attention]") {
  struct Case {
    Arch arch;
    int64_t head_dim;
  };
  for (const Case& c : {Case{Arch::mixtral, 16}, Case{Arch::mixtral, 4}, Case{Arch::qwen3_moe, 16},
                        Case{Arch::qwen3_moe, 0}, Case{Arch::olmoe, 0}, Case{Arch::qwen2_moe, 0}}) {
    INFO(arch_name(c.arch) << " head_dim " << c.head_dim);
    FamilyModel m(c.arch, c.head_dim);
    const int64_t v = m.config.vocab_size, T = m.config.seq;
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < T; ++t) ids.push_back(static_cast<int32_t>((t * 7 + 3) % v));
    const Tensor full = m.model.logits(Tensor::from_vector({1, T}, ids));
    KVCache cache = m.model.make_cache(1);
    Tensor logits = m.model.forward_cached(
        Tensor::from_vector({1, 5}, std::vector<int32_t>(ids.begin(), ids.begin() + 5)), cache);
    CHECK(relative_error(logits, full, 4) <= 1e-5);
    for (int64_t t = 5; t < T; ++t) {
      INFO("position " << t);
      logits =
          m.model.forward_cached(Tensor::from_vector({1, 1}, std::vector<int32_t>{ids[t]}), cache);
      CHECK(relative_error(logits, full, t) <= 1e-5);
    }
  }
}
