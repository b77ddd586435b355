// Finite-difference checks of the dense layers' backward passes: every layer's input gradient
// and every parameter gradient against central differences of a double-accumulated loss
// dot(y, r) with a random r. Also causality of attention.
// Shape letters: N tokens, B batch, T sequence, D model width, F hidden, H heads, KV kv heads,
// V vocabulary.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>

#include "moe/nn/attention.h"
#include "moe/nn/embedding.h"
#include "moe/nn/linear.h"
#include "moe/nn/loss.h"
#include "moe/nn/mlp.h"
#include "moe/nn/norm.h"
#include "moe/param.h"
#include "support/gradcheck.h"

using namespace moe;
using namespace moe::nn;

namespace {

constexpr double kTolerance = 1e-2;

// Overwrite every parameter with fresh normal values (so biases, norm weights are not 0 / 1).
void randomize(ParamSet& ps, uint64_t seed, float scale, float offset = 0.0f) {
  for (Param* p : ps.all()) {
    Tensor r = test::random_tensor(p->value.shape(), seed++, scale);
    float* v = p->value.data<float>();
    const float* s = r.data<float>();
    for (int64_t i = 0; i < r.numel(); ++i) v[i] = s[i] + offset;
    p->refresh_compute();
  }
}

// Checks the analytic gradient of every parameter of `ps` against central differences of `loss`.
// `zero_grad_param` names a parameter whose true gradient is zero (the key bias: softmax is
// invariant to adding q.b_k to every score of a query); both gradients must then be ~0.
void check_params(ParamSet& ps, const std::function<double()>& loss,
                  const std::string& zero_grad_param = "") {
  REQUIRE(ps.size() > 0);
  for (Param* p : ps.all()) {
    INFO("parameter " << p->name);
    if (p->name == zero_grad_param) {
      auto r = test::check_gradient(p->value, p->grad, loss);
      REQUIRE(r.grad_scale < 1e-3);
      for (float g : p->grad.to_vector()) REQUIRE(std::fabs(g) < 1e-5f);
      continue;
    }
    MOE_REQUIRE_GRAD(test::check_gradient(p->value, p->grad, loss), kTolerance);
  }
}

bool same_rows(const Tensor& a, const Tensor& b, int64_t begin, int64_t end) {
  const int64_t width = a.dim(1);
  return std::memcmp(a.data<float>() + begin * width, b.data<float>() + begin * width,
                     sizeof(float) * (end - begin) * width) == 0;
}

}  // namespace

TEST_CASE("dense: Linear gradients with and without bias", "[dense][gradcheck]") {
  for (bool bias : {true, false}) {
    INFO("bias " << bias);
    ParamSet ps(11);
    Linear linear(ps, "proj", 6, 5, bias, 0.5f);
    REQUIRE(ps.size() == (bias ? 2u : 1u));
    randomize(ps, 100, 0.5f);
    Tensor x = test::random_tensor({4, 6}, 1);
    Tensor r = test::random_tensor({4, 5}, 2);
    auto loss = [&] { return test::dot(linear.forward(x), r); };
    ps.zero_grad();
    Tensor dx = linear.backward(r, x);
    MOE_REQUIRE_GRAD(test::check_gradient(x, dx, loss), kTolerance);
    check_params(ps, loss);
  }
}

TEST_CASE("dense: Embedding table gradient with repeated ids", "[dense][gradcheck]") {
  ParamSet ps(12);
  Embedding embedding(ps, "wte", 7, 4, 0.5f);
  Tensor ids = Tensor::from_vector({9}, std::vector<int32_t>{3, 0, 3, 6, 1, 3, 0, 5, 6});
  Tensor r = test::random_tensor({9, 4}, 3);
  auto loss = [&] { return test::dot(embedding.forward(ids), r); };
  ps.zero_grad();
  embedding.backward(r, ids);
  check_params(ps, loss);
  // Row 2 and 4 were never looked up: exactly zero gradient.
  const float* g = embedding.table().grad.data<float>();
  for (int j = 0; j < 4; ++j) {
    REQUIRE(g[2 * 4 + j] == 0.0f);
    REQUIRE(g[4 * 4 + j] == 0.0f);
  }
}

TEST_CASE("dense: LayerNorm and RMSNorm gradients", "[dense][gradcheck]") {
  for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
    INFO("kind " << (kind == NormKind::layernorm ? "layernorm" : "rmsnorm"));
    ParamSet ps(13);
    Norm norm(ps, "ln", 8, kind, 1e-5f);
    REQUIRE(ps.size() == (kind == NormKind::layernorm ? 2u : 1u));
    randomize(ps, 200, 0.3f, 1.0f);
    Tensor x = test::random_tensor({5, 8}, 4, 1.5f);
    float* xs = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) xs[i] += 0.7f;  // a non-zero mean to remove
    Tensor r = test::random_tensor({5, 8}, 5);
    auto loss = [&] { return test::dot(norm.forward(x, nullptr), r); };
    Norm::Saved saved;
    Tensor y = norm.forward(x, &saved);
    ps.zero_grad();
    Tensor dx = norm.backward(r, saved);
    MOE_REQUIRE_GRAD(test::check_gradient(x, dx, loss), kTolerance);
    check_params(ps, loss);
  }
}

namespace {

void check_attention(const AttentionConfig& config, int64_t batch, int64_t seq) {
  ParamSet ps(14);
  Attention attention(ps, "attn", config);
  randomize(ps, 300, 0.4f);
  const int64_t n = batch * seq;
  Tensor x = test::random_tensor({n, config.d_model}, 6);
  Tensor r = test::random_tensor({n, config.d_model}, 7);
  auto loss = [&] { return test::dot(attention.forward(x, batch, seq, nullptr), r); };
  Attention::Saved saved;
  attention.forward(x, batch, seq, &saved);
  ps.zero_grad();
  Tensor dx = attention.backward(r, saved);
  MOE_REQUIRE_GRAD(test::check_gradient(x, dx, loss), kTolerance);
  // The key bias has a zero gradient only when q.b_k is the same for every key of a query: no
  // RoPE (which rotates b_k by the key's position), no qk-norm (which is not linear).
  const bool k_bias_inert = !config.rope && config.qk_norm == QkNorm::none;
  check_params(ps, loss, k_bias_inert ? "attn.k.bias" : "");
}

}  // namespace

TEST_CASE("dense: Attention gradients, gpt flavour (bias, no rope, kv_heads == heads)",
          "[dense][gradcheck]") {
  AttentionConfig config;
  config.d_model = 16;
  config.heads = 4;
  config.kv_heads = 4;
  config.qkv_bias = true;
  config.o_bias = true;
  config.rope = false;
  check_attention(config, 2, 5);
}

TEST_CASE("dense: Attention gradients, mixtral flavour (rope, GQA 4 heads / 2 kv heads)",
          "[dense][gradcheck]") {
  AttentionConfig config;
  config.d_model = 16;
  config.heads = 4;
  config.kv_heads = 2;
  config.rope = true;
  config.rope_theta = 100.0f;  // low theta: every pair rotates noticeably over 6 positions
  check_attention(config, 2, 6);
}

// Qwen3-MoE's shape: H*hd wider than D (q [H*hd, D], o [D, H*hd]), grouped-query heads.
TEST_CASE("dense: Attention gradients with head_dim != d_model / heads (GQA, rope)",
          "[dense][gradcheck]") {
  AttentionConfig config;
  config.d_model = 12;
  config.heads = 4;
  config.kv_heads = 2;
  config.head_dim = 6;  // H*hd = 24 != D = 12
  config.rope = true;
  config.rope_theta = 100.0f;
  ParamSet shapes(1);
  Attention attention(shapes, "attn", config);
  REQUIRE(attention.head_dim() == 6);
  REQUIRE(shapes.at("attn.q.weight").value.shape() == Shape{24, 12});
  REQUIRE(shapes.at("attn.k.weight").value.shape() == Shape{12, 12});
  REQUIRE(shapes.at("attn.o.weight").value.shape() == Shape{12, 24});
  check_attention(config, 2, 5);
  // An odd head dim (no RoPE) narrower than D / H.
  config.rope = false;
  config.head_dim = 3;
  check_attention(config, 2, 5);
}

namespace {

// qk-norm, per head (Qwen3-MoE) and full width (OLMoE), with GQA and hd != D/H: with RoPE at an
// even hd, without RoPE at the odd `odd_hd`. eps 0.05 so that the norm's eps term is not
// negligible in the gradient either.
void check_qk_norm_attention(bool qkv_bias, int64_t odd_hd) {
  for (QkNorm qk : {QkNorm::head, QkNorm::full}) {
    for (int64_t hd : {int64_t{6}, odd_hd}) {
      INFO((qk == QkNorm::head ? "per-head" : "full-width") << " qk-norm, head_dim " << hd);
      AttentionConfig config;
      config.d_model = 12;
      config.heads = 4;
      config.kv_heads = 2;
      config.head_dim = hd;
      config.qkv_bias = qkv_bias;
      config.rope = hd % 2 == 0;
      config.rope_theta = 100.0f;
      config.qk_norm = qk;
      config.norm_eps = 0.05f;
      check_attention(config, 2, 5);
    }
  }
}

}  // namespace

TEST_CASE("dense: Attention gradients with qk-norm, per head and full width",
          "[dense][gradcheck]") {
  check_qk_norm_attention(false, 3);
}

// Qwen2-MoE: biases on q, k and v, none on o, with RoPE (the key bias then has a gradient).
TEST_CASE("dense: Attention gradients with q/k/v biases and no o bias", "[dense][gradcheck]") {
  AttentionConfig config;
  config.d_model = 16;
  config.heads = 4;
  config.kv_heads = 2;
  config.qkv_bias = true;
  config.rope = true;
  config.rope_theta = 100.0f;
  ParamSet shapes(1);
  Attention attention(shapes, "attn", config);
  REQUIRE(shapes.at("attn.q.bias").value.shape() == Shape{16});
  REQUIRE(shapes.at("attn.k.bias").value.shape() == Shape{8});
  REQUIRE(shapes.at("attn.v.bias").value.shape() == Shape{8});
  REQUIRE(shapes.find("attn.o.bias") == nullptr);
  REQUIRE(shapes.size() == 7u);
  check_attention(config, 2, 6);
}

// Every feature at once: q/k/v biases, qk-norm, hd != D/H, GQA, RoPE (and an odd hd without).
TEST_CASE("dense: Attention gradients with biases, qk-norm and head_dim together",
          "[dense][gradcheck]") {
  check_qk_norm_attention(true, 5);
}

TEST_CASE("dense: Attention is causal (a later token never changes earlier outputs)",
          "[dense][gradcheck]") {
  for (bool mixtral : {false, true}) {
    INFO("flavour " << (mixtral ? "mixtral" : "gpt"));
    AttentionConfig config;
    config.d_model = 24;
    config.heads = 4;
    config.kv_heads = mixtral ? 1 : 4;
    config.qkv_bias = config.o_bias = !mixtral;
    config.rope = mixtral;
    ParamSet ps(15);
    Attention attention(ps, "attn", config);
    randomize(ps, 400, 0.4f);
    const int64_t batch = 2, seq = 9, changed = 4;
    Tensor x = test::random_tensor({batch * seq, 24}, 8);
    Tensor y0 = attention.forward(x, batch, seq, nullptr);
    x.data<float>()[changed * 24 + 5] += 1.0f;  // batch 0, position 4
    Tensor y1 = attention.forward(x, batch, seq, nullptr);
    REQUIRE(same_rows(y0, y1, 0, changed));    // earlier positions: bitwise equal
    REQUIRE(same_rows(y0, y1, seq, 2 * seq));  // the other sequence: untouched
    for (int64_t t = changed; t < seq; ++t) REQUIRE_FALSE(same_rows(y0, y1, t, t + 1));
  }
}

TEST_CASE("dense: MLP gradients, gelu and swiglu", "[dense][gradcheck]") {
  for (Activation activation : {Activation::gelu, Activation::swiglu}) {
    for (bool bias : {true, false}) {
      INFO("activation " << (activation == Activation::gelu ? "gelu" : "swiglu") << " bias "
                         << bias);
      MlpConfig config;
      config.d_model = 6;
      config.d_ff = 10;
      config.activation = activation;
      config.bias = bias;
      ParamSet ps(16);
      MLP mlp(ps, "mlp", config);
      const size_t expected = (activation == Activation::swiglu ? 3u : 2u) * (bias ? 2u : 1u);
      REQUIRE(ps.size() == expected);
      randomize(ps, 500, 0.6f);
      Tensor x = test::random_tensor({5, 6}, 9);
      Tensor r = test::random_tensor({5, 6}, 10);
      auto loss = [&] { return test::dot(mlp.forward(x, nullptr), r); };
      MLP::Saved saved;
      mlp.forward(x, &saved);
      ps.zero_grad();
      Tensor dx = mlp.backward(r, saved);
      MOE_REQUIRE_GRAD(test::check_gradient(x, dx, loss), kTolerance);
      check_params(ps, loss);
    }
  }
}

TEST_CASE("dense: cross_entropy gradient, with ignored targets and a scale", "[dense][gradcheck]") {
  Tensor logits = test::random_tensor({6, 9}, 11, 2.0f);
  Tensor targets = Tensor::from_vector({6}, std::vector<int32_t>{4, -1, 0, 8, -1, 2});
  auto loss = [&] { return cross_entropy(logits, targets, nullptr); };
  Tensor dlogits;
  cross_entropy(logits, targets, &dlogits, 1.0f);
  MOE_REQUIRE_GRAD(test::check_gradient(logits, dlogits, loss), kTolerance);
  // Ignored rows get exactly zero gradient; `scale` multiplies the gradient only.
  Tensor scaled;
  double a = cross_entropy(logits, targets, &scaled, 3.0f);
  double b = cross_entropy(logits, targets, nullptr, 1.0f);
  REQUIRE(a == b);
  for (int64_t i = 0; i < logits.numel(); ++i) {
    REQUIRE(scaled.data<float>()[i] == Approx(3.0f * dlogits.data<float>()[i]).margin(1e-7));
    const int64_t row = i / 9;
    if (row == 1 || row == 4) REQUIRE(dlogits.data<float>()[i] == 0.0f);
  }
}
