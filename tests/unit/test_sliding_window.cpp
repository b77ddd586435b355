// Sliding-window attention (issue 44): the core op against a double-precision reference written
// from transformers 5's mask (masking_utils.sliding_window_overlay: key j visible to query i when
// i - W < j <= i), its gradients by finite differences, the query-block and cached (decode) paths
// against the full forward, a model whose layers differ in window, and the model config's new
// fields (absent in old checkpoints: they load as before).
// Shape letters: B batch, T sequence, H query heads, KV kv heads, hd head dim, W window.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "moe/infer/generate.h"
#include "moe/models/transformer.h"
#include "moe/nn/attention.h"
#include "moe/ops/dense.h"
#include "moe/param.h"
#include "moe/rng.h"
#include "support/bits.h"
#include "support/gradcheck.h"
#include "support/models.h"

using namespace moe;

namespace {

// Windowed causal attention in double: ctx [B*T, H*hd], probs [B,H,T,T] (zero where not visible).
struct Reference {
  std::vector<double> ctx, probs;
};

Reference reference_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                              const ops::AttentionShape& s) {
  const int64_t T = s.seq, H = s.heads, hd = s.head_dim, group = s.heads / s.kv_heads;
  const int64_t ldq = H * hd, ldk = s.kv_heads * hd;
  Reference r{std::vector<double>(static_cast<size_t>(s.batch * T * ldq), 0.0),
              std::vector<double>(static_cast<size_t>(s.batch * H * T * T), 0.0)};
  const float *qs = q.data<float>(), *ks = k.data<float>(), *vs = v.data<float>();
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t g = h / group;
        const int64_t first = s.window > 0 ? std::max<int64_t>(0, i - s.window + 1) : 0;
        std::vector<double> score(static_cast<size_t>(T), 0.0);
        double top = -INFINITY, sum = 0;
        for (int64_t j = first; j <= i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < hd; ++e)
            d += double(qs[(b * T + i) * ldq + h * hd + e]) * ks[(b * T + j) * ldk + g * hd + e];
          score[j] = d / std::sqrt(double(hd));
          top = std::max(top, score[j]);
        }
        for (int64_t j = first; j <= i; ++j) sum += std::exp(score[j] - top);
        double* p = &r.probs[static_cast<size_t>(((b * H + h) * T + i) * T)];
        for (int64_t j = first; j <= i; ++j) p[j] = std::exp(score[j] - top) / sum;
        for (int64_t e = 0; e < hd; ++e) {
          double o = 0;
          for (int64_t j = first; j <= i; ++j) o += p[j] * vs[(b * T + j) * ldk + g * hd + e];
          r.ctx[static_cast<size_t>((b * T + i) * ldq + h * hd + e)] = o;
        }
      }
  return r;
}

double worst_difference(const Tensor& got, const std::vector<double>& want) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::fabs(double(got.data<float>()[i]) - want[i]));
  return worst;
}

}  // namespace

// Windows of 1 (a query sees itself only), 3, 6 and T - 1, and T (the same as none); GQA heads,
// two sequences. The f32 op against double: probabilities of O(1/W) and contexts of O(1) within
// 1e-5 (each is a softmax or a sum of <= T products of O(1) terms, ~T ulps), and every masked
// probability exactly zero.
TEST_CASE("sliding window: the core op matches a double reference per window", "[window]") {
  for (int64_t window : {1, 3, 6, 10, 11}) {
    const ops::AttentionShape s{2, 11, 4, 2, 8, window};
    INFO("window " << window);
    const int64_t n = s.batch * s.seq;
    Tensor q = test::random_tensor({n, 32}, 60), k = test::random_tensor({n, 16}, 61),
           v = test::random_tensor({n, 16}, 62);
    Tensor probs = Tensor::empty({2, 4, 11, 11}), ctx = Tensor::empty({n, 32});
    ops::attention_forward(q, k, v, s, probs, ctx);
    const Reference ref = reference_attention(q, k, v, s);
    CHECK(worst_difference(probs, ref.probs) <= 1e-5);
    CHECK(worst_difference(ctx, ref.ctx) <= 1e-5);
    for (size_t i = 0; i < ref.probs.size(); ++i)
      if (ref.probs[i] == 0.0) REQUIRE(probs.data<float>()[i] == 0.0f);
    // Inference's query blocks (1 row: the decode loops; 4 rows: blocks that start inside the
    // window of the one before) give the same context.
    for (int64_t rows : {1, 4, 64}) {
      INFO("block rows " << rows);
      Tensor blocks = Tensor::empty({n, 32});
      ops::attention_forward_blocks(q, k, v, s, rows, blocks);
      CHECK(worst_difference(blocks, ref.ctx) <= 1e-5);
    }
  }
  // The window changes the result where it cuts (a test that cannot pass without the mask).
  const ops::AttentionShape full{1, 8, 2, 1, 4}, cut{1, 8, 2, 1, 4, 3};
  Tensor q = test::random_tensor({8, 8}, 63), k = test::random_tensor({8, 4}, 64),
         v = test::random_tensor({8, 4}, 65);
  Tensor pf = Tensor::empty({1, 2, 8, 8}), pc = Tensor::empty({1, 2, 8, 8}),
         cf = Tensor::empty({8, 8}), cc = Tensor::empty({8, 8});
  ops::attention_forward(q, k, v, full, pf, cf);
  ops::attention_forward(q, k, v, cut, pc, cc);
  CHECK(test::bitwise_equal(cf.rows(0, 3), cc.rows(0, 3)));  // queries 0..2 see all their keys
  CHECK_FALSE(test::bitwise_equal(cf.rows(3, 8), cc.rows(3, 8)));
}

TEST_CASE("sliding window: backward matches finite differences of the core op", "[window]") {
  for (const ops::AttentionShape& s :
       {ops::AttentionShape{2, 7, 4, 2, 4, 3}, ops::AttentionShape{1, 40, 4, 2, 4, 9}}) {
    INFO("T " << s.seq << " window " << s.window);
    const int64_t n = s.batch * s.seq;
    Tensor q = test::random_tensor({n, 16}, 70), k = test::random_tensor({n, 8}, 71),
           v = test::random_tensor({n, 8}, 72), r = test::random_tensor({n, 16}, 73);
    Tensor probs = Tensor::empty({s.batch, s.heads, s.seq, s.seq}), ctx = Tensor::empty({n, 16});
    auto loss = [&] {
      ops::attention_forward(q, k, v, s, probs, ctx);
      return test::dot(ctx, r);
    };
    loss();
    Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(k.shape()),
           dv = Tensor::empty(v.shape());
    ops::attention_backward(r, q, k, v, probs, s, dq, dk, dv);
    MOE_REQUIRE_GRAD(test::check_gradient(q, dq, loss), 1e-2);
    MOE_REQUIRE_GRAD(test::check_gradient(k, dk, loss), 1e-2);
    MOE_REQUIRE_GRAD(test::check_gradient(v, dv, loss), 1e-2);
  }
}

namespace {

nn::AttentionConfig windowed_config(int64_t window) {
  nn::AttentionConfig c;
  c.d_model = 16;
  c.heads = 4;
  c.kv_heads = 2;
  c.rope = true;
  c.rope_theta = 100.0f;
  c.window = window;
  return c;
}

void randomize(ParamSet& ps, uint64_t seed) {
  for (Param* p : ps.all()) test::randomize_param(*p, seed++, 0.4f);
}

}  // namespace

// The layer's input and parameter gradients through RoPE, GQA and the window.
TEST_CASE("sliding window: attention layer gradients by finite differences", "[window]") {
  ParamSet ps(14);
  nn::Attention attention(ps, "attn", windowed_config(3));
  randomize(ps, 300);
  const int64_t batch = 2, seq = 7, n = batch * seq;
  Tensor x = test::random_tensor({n, 16}, 6), r = test::random_tensor({n, 16}, 7);
  auto loss = [&] { return test::dot(attention.forward(x, batch, seq, nullptr), r); };
  nn::Attention::Saved saved;
  attention.forward(x, batch, seq, &saved);
  ps.zero_grad();
  Tensor dx = attention.backward(r, saved);
  MOE_REQUIRE_GRAD(test::check_gradient(x, dx, loss), 1e-2);
  for (Param* p : ps.all()) {
    INFO("parameter " << p->name);
    MOE_REQUIRE_GRAD(test::check_gradient(p->value, p->grad, loss), 1e-2);
  }
}

// A prefill of 5 then single tokens past the window (the decode path reads only the window's
// keys), against the full forward: within 1e-5 of the scale (as the unwindowed cache test).
TEST_CASE("sliding window: the cached forward equals the full forward", "[window]") {
  ParamSet ps(4);
  nn::Attention attention(ps, "attn", windowed_config(3));
  randomize(ps, 40);
  const int64_t T = 9;
  Tensor x = test::random_tensor({T, 16}, 41);
  const Tensor full = attention.forward(x, 1, T, nullptr);
  nn::AttentionCache whole = attention.make_cache(1, T);
  CHECK(test::bitwise_equal(attention.forward_cached(x, ops::CachedRows{{0}, {0}, {T}}, whole),
                            full));
  nn::AttentionCache cache = attention.make_cache(2, T);
  auto near = [&](const Tensor& got, int64_t first) {
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      diff = std::max(diff,
                      double(std::fabs(got.data<float>()[i] - full.data<float>()[first * 16 + i])));
      scale = std::max(scale, double(std::fabs(full.data<float>()[first * 16 + i])));
    }
    REQUIRE(scale > 0.01);
    return diff / scale;
  };
  CHECK(near(attention.forward_cached(x.rows(0, 5), ops::CachedRows{{1}, {0}, {5}}, cache), 0) <=
        1e-5);
  for (int64_t t = 5; t < T; ++t) {
    INFO("position " << t);
    const Tensor step =
        attention.forward_cached(x.rows(t, t + 1).clone(), ops::CachedRows{{1}, {t}, {1}}, cache);
    CHECK(near(step, t) <= 1e-5);
  }
}

namespace {

// A 3-layer mixtral whose layers 0 and 2 attend through a window of 4 (gpt-oss's alternation,
// layer_types), layer 1 to everything; parameters with noise so every weight matters.
struct WindowedModel {
  explicit WindowedModel(std::vector<int64_t> layers)
      : config(make_config(std::move(layers))), params(23), model(config, params) {
    const uint64_t key = rng_key(23, {0xb1d});
    uint64_t index = 0;
    for (Param* p : params.all()) {
      float* d = p->value.data<float>();
      for (int64_t i = 0; i < p->value.numel(); ++i) d[i] += 0.1f * rng_normal(key, index++);
      p->refresh_compute();
    }
  }
  static ModelConfig make_config(std::vector<int64_t> layers) {
    ModelConfig c = test::small_model_config(Arch::mixtral);
    c.layers = 3;
    c.vocab_size = 40;
    c.seq = 14;
    c.sliding_window = 4;
    c.window_layers = std::move(layers);
    c.resolve();
    return c;
  }
  ModelConfig config;
  ParamSet params;
  Transformer model;
};

}  // namespace

TEST_CASE("sliding window: a model's cached logits equal its full forward", "[window]") {
  WindowedModel m({0, 2});
  REQUIRE(m.config.window_of(0) == 4);
  REQUIRE(m.config.window_of(1) == 0);
  REQUIRE(m.config.window_of(2) == 4);
  const int64_t T = m.config.seq;
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) ids.push_back(static_cast<int32_t>((t * 7 + 3) % 40));
  const Tensor full = m.model.logits(Tensor::from_vector({1, T}, ids));
  KVCache cache = m.model.make_cache(1);
  Tensor logits = m.model.forward_cached(
      Tensor::from_vector({1, 3}, std::vector<int32_t>(ids.begin(), ids.begin() + 3)), cache);
  for (int64_t t = 3; t < T; ++t) {
    logits =
        m.model.forward_cached(Tensor::from_vector({1, 1}, std::vector<int32_t>{ids[t]}), cache);
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < 40; ++i) {
      const double want = full.data<float>()[t * 40 + i];
      diff = std::max(diff, std::fabs(double(logits.data<float>()[i]) - want));
      scale = std::max(scale, std::fabs(want));
    }
    INFO("position " << t << ": " << diff << " of " << scale);
    CHECK(diff <= 1e-5 * scale);
  }
  // The window changes the model's logits once a query reaches past it (positions >= 4).
  WindowedModel none({0, 2});
  none.config.sliding_window = 0;
  none.config.window_layers.clear();
  ParamSet plain_params(23);
  Transformer plain(none.config, plain_params);
  for (size_t i = 0; i < plain_params.all().size(); ++i)
    plain_params.all()[i]->value.copy_from(m.params.all()[i]->value);
  for (Param* p : plain_params.all()) p->refresh_compute();
  const Tensor unwindowed = plain.logits(Tensor::from_vector({1, T}, ids));
  // Positions 0..3 see every key either way: equal up to the experts' grouped GEMMs, whose
  // shapes follow the other tokens' routing (not bitwise); later ones move by O(0.1).
  auto gap = [&](int64_t t) {
    double diff = 0;
    for (int64_t i = 0; i < 40; ++i)
      diff = std::max(diff, double(std::fabs(unwindowed.data<float>()[t * 40 + i] -
                                             full.data<float>()[t * 40 + i])));
    return diff;
  };
  for (int64_t t = 0; t < 4; ++t) CHECK(gap(t) <= 1e-5);
  double moved = 0;
  for (int64_t t = 4; t < T; ++t) moved = std::max(moved, gap(t));
  CHECK(moved > 1e-3);
}

TEST_CASE("sliding window: config fields, old configs and bad values", "[window]") {
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.resolve();
  // Off by default and not written: a config without them writes what it wrote before.
  const nlohmann::json old = to_json(c);
  CHECK_FALSE(old.contains("sliding_window"));
  CHECK_FALSE(old.contains("window_layers"));
  CHECK_FALSE(old.contains("tie_embeddings"));
  const ModelConfig back = model_config_from_json(old);
  CHECK(back.sliding_window == 0);
  CHECK(back.window_layers.empty());
  CHECK_FALSE(back.tie_embeddings);
  CHECK(to_json(back) == old);
  // Set: they round trip.
  c.layers = 3;
  c.experts_per_layer.clear();
  c.sliding_window = 5;
  c.window_layers = {0, 2};
  c.tie_embeddings = true;
  c.resolve();
  const ModelConfig round = model_config_from_json(to_json(c));
  CHECK(round.sliding_window == 5);
  CHECK(round.window_layers == std::vector<int64_t>{0, 2});
  CHECK(round.tie_embeddings);
  CHECK(round.tied_embeddings());
  // Refused by name.
  c.sliding_window = -1;
  REQUIRE_THROWS_WITH(c.validate(), Catch::Contains("sliding window must be between 0"));
  c.sliding_window = 5;
  c.window_layers = {2, 0};
  REQUIRE_THROWS_WITH(c.validate(), Catch::Contains("ascending order"));
  c.window_layers = {3};
  REQUIRE_THROWS_WITH(c.validate(), Catch::Contains("layer indices 0..2"));
  c.window_layers = {1};
  c.sliding_window = 0;
  REQUIRE_THROWS_WITH(c.validate(), Catch::Contains("sliding window is 0"));
}

// moe-infer generate's path (a prefill, then one token a step through the cache, the decode
// reading only the window's keys) against greedy decoding by the uncached forward of the whole
// sequence each step: the same tokens, past the window on every windowed layer.
TEST_CASE("sliding window: greedy generation equals the uncached forward's", "[window]") {
  WindowedModel m({0, 2});
  const std::vector<int32_t> prompt = {5, 17, 3};
  infer::SamplingConfig greedy;
  greedy.max_new = 10;
  const std::vector<infer::Generation> out = infer::generate(m.model, {prompt}, greedy, 1);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].tokens.size() == 10);
  std::vector<int32_t> seq = prompt;
  for (int64_t step = 0; step < 10; ++step) {
    const int64_t T = static_cast<int64_t>(seq.size());
    const Tensor logits = m.model.logits(Tensor::from_vector({1, T}, seq));
    const float* last = logits.data<float>() + (T - 1) * 40;
    seq.push_back(static_cast<int32_t>(std::max_element(last, last + 40) - last));
  }
  CHECK(std::vector<int32_t>(seq.begin() + 3, seq.end()) == out[0].tokens);
}
