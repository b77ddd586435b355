// Attention sinks (gpt-oss, issue 44): a learned logit sinks[h] a query head that joins its softmax
// rows' maximum and denominator and brings no value. transformers' modeling_gpt_oss appends it to
// each score row as one more column, softmaxes, and drops that column; the double reference below
// is that formula. Tested: the core op (full, by query blocks, cached) against the reference with
// windows, GQA and heads whose sinks sit far below, near and far above the scores; very negative
// sinks giving the plain op's bits; the gradients of q, k, v and the sinks by finite differences
// and the sinks' against the derived formula in double; the layer's parameter (name, dtype,
// optimizer, checkpoint) and its cached decode against the uncached forward; and the CUDA kernel
// bodies on the CPU harness (the [cuda] comparison is tests/cuda/test_cuda_attention_sinks.cpp).
// Shape letters: B batch, T sequence, H query heads, KV kv heads, hd head dim, W window.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cuda/attention.cuh"
#include "moe/io/checkpoint.h"
#include "moe/nn/attention.h"
#include "moe/ops/dense.h"
#include "moe/optim/adamw.h"
#include "moe/param.h"
#include "support/bits.h"
#include "support/cuda.h"
#include "support/gradcheck.h"
#include "support/run.h"

using namespace moe;

namespace {

// ctx [B*T, H*hd] and probs [B,H,T,T] in double, and each row's sink share p_sink [B,H,T].
struct Reference {
  std::vector<double> ctx, probs, sink_share;
};

// The gpt-oss formula: scores s_ij = q_i . k_j / sqrt(hd) over the visible keys (causal, the last
// W with a window), m = max(sink_h, max_j s_ij), Z = exp(sink_h - m) + sum_j exp(s_ij - m),
// p_ij = exp(s_ij - m) / Z, p_sink = exp(sink_h - m) / Z, ctx_i = sum_j p_ij v_j.
Reference reference(const Tensor& q, const Tensor& k, const Tensor& v,
                    const std::vector<float>& sinks, const ops::AttentionShape& s) {
  const int64_t T = s.seq, H = s.heads, hd = s.head_dim, group = s.heads / s.kv_heads;
  const int64_t ldq = H * hd, ldk = s.kv_heads * hd;
  Reference r{std::vector<double>(static_cast<size_t>(s.batch * T * ldq), 0.0),
              std::vector<double>(static_cast<size_t>(s.batch * H * T * T), 0.0),
              std::vector<double>(static_cast<size_t>(s.batch * H * T), 0.0)};
  const float *qs = q.data<float>(), *ks = k.data<float>(), *vs = v.data<float>();
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t g = h / group;
        const int64_t first = s.window > 0 ? std::max<int64_t>(0, i - s.window + 1) : 0;
        std::vector<double> score(static_cast<size_t>(T), 0.0);
        double top = sinks[h];
        for (int64_t j = first; j <= i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < hd; ++e)
            d += double(qs[(b * T + i) * ldq + h * hd + e]) * ks[(b * T + j) * ldk + g * hd + e];
          score[j] = d / std::sqrt(double(hd));
          top = std::max(top, score[j]);
        }
        double z = std::exp(double(sinks[h]) - top);
        for (int64_t j = first; j <= i; ++j) z += std::exp(score[j] - top);
        const int64_t row = (b * H + h) * T + i;
        r.sink_share[row] = std::exp(double(sinks[h]) - top) / z;
        double* p = &r.probs[static_cast<size_t>(row * T)];
        for (int64_t j = first; j <= i; ++j) p[j] = std::exp(score[j] - top) / z;
        for (int64_t e = 0; e < hd; ++e) {
          double o = 0;
          for (int64_t j = first; j <= i; ++j) o += p[j] * vs[(b * T + j) * ldk + g * hd + e];
          r.ctx[static_cast<size_t>((b * T + i) * ldq + h * hd + e)] = o;
        }
      }
  return r;
}

// d loss / d sinks[h] for loss = sum ctx . dctx, in double from the reference's probabilities:
// -sum over head h's rows of p_sink * sum_j p_ij (dctx_i . v_j) (kernels::sink_gradient_row).
std::vector<double> reference_sink_grad(const Reference& ref, const Tensor& dctx, const Tensor& v,
                                        const ops::AttentionShape& s) {
  const int64_t T = s.seq, H = s.heads, hd = s.head_dim, group = H / s.kv_heads;
  const int64_t ldq = H * hd, ldk = s.kv_heads * hd;
  std::vector<double> grad(static_cast<size_t>(H), 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t row = (b * H + h) * T + i;
        double dot = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double g = 0;
          for (int64_t e = 0; e < hd; ++e)
            g += double(dctx.data<float>()[(b * T + i) * ldq + h * hd + e]) *
                 v.data<float>()[(b * T + j) * ldk + (h / group) * hd + e];
          dot += ref.probs[static_cast<size_t>(row * T + j)] * g;
        }
        grad[h] -= ref.sink_share[row] * dot;
      }
  return grad;
}

// max over head h's values of |got - want|, over max |want| of that head: a head whose values are
// all ~e^-40 (a sink far above its scores) is held to the same relative accuracy as the others.
// Values are laid out [.., H, inner] with `inner` consecutive values a head (T*T for probs) or
// [N, H*hd] with inner = hd; either way value i belongs to head (i / inner) % H.
double worst_per_head(const std::vector<float>& got, const std::vector<double>& want, int64_t H,
                      int64_t inner) {
  REQUIRE(got.size() == want.size());
  std::vector<double> diff(static_cast<size_t>(H), 0.0), scale(static_cast<size_t>(H), 0.0);
  for (size_t i = 0; i < want.size(); ++i) {
    const size_t h = (i / static_cast<size_t>(inner)) % static_cast<size_t>(H);
    diff[h] = std::max(diff[h], std::fabs(double(got[i]) - want[i]));
    scale[h] = std::max(scale[h], std::fabs(want[i]));
  }
  double worst = 0;
  for (int64_t h = 0; h < H; ++h) {
    REQUIRE(scale[h] > 0.0);
    worst = std::max(worst, diff[h] / scale[h]);
  }
  return worst;
}

Tensor sinks_tensor(const std::vector<float>& sinks) {
  return Tensor::from_vector({static_cast<int64_t>(sinks.size())}, sinks);
}

struct Operands {
  Tensor q, k, v, dctx;
  Operands(const ops::AttentionShape& s, uint64_t seed)
      : q(test::random_tensor({s.batch * s.seq, s.heads * s.head_dim}, seed)),
        k(test::random_tensor({s.batch * s.seq, s.kv_heads * s.head_dim}, seed + 1)),
        v(test::random_tensor({s.batch * s.seq, s.kv_heads * s.head_dim}, seed + 2)),
        dctx(test::random_tensor({s.batch * s.seq, s.heads * s.head_dim}, seed + 3)) {}
};

}  // namespace

// Sinks -30 (far below the O(1) scores: p_sink ~ 1e-13), 0 and 1.5 (shares of O(0.1)), 40 (far
// above: every probability ~e^-40, p_sink ~ 1). The f32 op against double, per head relative to
// the head's largest value: 1e-5 (each value is a softmax of <= T exponentials of scores that are
// sums of hd products, exp_f within 1 ulp: ~(T + hd) ulps, 2e-6; the -40 head's exponent
// s - 40 rounds to 40 * 2^-24 = 2.4e-6 relative in its exponential).
TEST_CASE("attention sinks: the core op matches a double reference", "[sinks]") {
  const std::vector<float> sinks{-30.0f, 0.0f, 1.5f, 40.0f};
  for (const ops::AttentionShape& s :
       {ops::AttentionShape{2, 11, 4, 2, 8, 0}, ops::AttentionShape{2, 11, 4, 2, 8, 3},
        ops::AttentionShape{1, 9, 4, 4, 4, 0}, ops::AttentionShape{1, 20, 4, 1, 16, 6}}) {
    INFO("B " << s.batch << " T " << s.seq << " KV " << s.kv_heads << " window " << s.window);
    const Operands o(s, 80);
    const int64_t n = s.batch * s.seq, ldq = s.heads * s.head_dim;
    Tensor probs = Tensor::empty({s.batch, s.heads, s.seq, s.seq}), ctx = Tensor::empty({n, ldq});
    ops::attention_forward(o.q, o.k, o.v, s, probs, ctx, sinks_tensor(sinks));
    const Reference ref = reference(o.q, o.k, o.v, sinks, s);
    CHECK(worst_per_head(probs.to_vector(), ref.probs, s.heads, s.seq * s.seq) <= 1e-5);
    CHECK(worst_per_head(ctx.to_vector(), ref.ctx, s.heads, s.head_dim) <= 1e-5);
    // The rows sum to 1 - p_sink: the sink takes its share (~1 on the last head).
    for (int64_t row = 0; row < s.batch * s.heads * s.seq; ++row) {
      double sum = 0;
      for (int64_t j = 0; j < s.seq; ++j) sum += probs.data<float>()[row * s.seq + j];
      REQUIRE(std::fabs(sum + ref.sink_share[row] - 1.0) <= 1e-5);
    }
    // Inference's query blocks (1 row: the decode loops) and a cache of the same keys.
    for (int64_t rows : {1, 4, 64}) {
      INFO("block rows " << rows);
      Tensor blocks = Tensor::empty({n, ldq});
      ops::attention_forward_blocks(o.q, o.k, o.v, s, rows, blocks, sinks_tensor(sinks));
      CHECK(worst_per_head(blocks.to_vector(), ref.ctx, s.heads, s.head_dim) <= 1e-5);
    }
  }
}

// A sink whose exponential underflows (far below every score) is no sink: exp_f gives +0, the
// maximum and the sum keep their values, and every output has the plain op's bits, the cached
// path's and the backward's too. Its gradient is -p_sink dot with p_sink = 1 - sum_j p_ij taken
// from the saved row: 0 in exact arithmetic, here within the rounding of that sum (each p_ij
// within ~2 ulps, the sum of <= T of them: T + 2 ulps of 1 a row) times |dot| <= max |g_ij|,
// over the B*T rows of a head.
TEST_CASE("attention sinks: very negative sinks give the plain attention's bits", "[sinks]") {
  const ops::AttentionShape s{2, 13, 4, 2, 8, 5};
  const Operands o(s, 90);
  const int64_t n = s.batch * s.seq, ldq = s.heads * s.head_dim;
  const Tensor none = sinks_tensor(std::vector<float>(4, -1e30f));
  const Shape ps{s.batch, s.heads, s.seq, s.seq};
  Tensor p0 = Tensor::empty(ps), c0 = Tensor::empty({n, ldq}), p1 = Tensor::empty(ps),
         c1 = Tensor::empty({n, ldq});
  ops::attention_forward(o.q, o.k, o.v, s, p0, c0);
  ops::attention_forward(o.q, o.k, o.v, s, p1, c1, none);
  CHECK(test::bitwise_equal(p0, p1));
  CHECK(test::bitwise_equal(c0, c1));
  for (int64_t rows : {1, 5}) {
    Tensor b0 = Tensor::empty({n, ldq}), b1 = Tensor::empty({n, ldq});
    ops::attention_forward_blocks(o.q, o.k, o.v, s, rows, b0);
    ops::attention_forward_blocks(o.q, o.k, o.v, s, rows, b1, none);
    CHECK(test::bitwise_equal(b0, b1));
  }
  Tensor dq0 = Tensor::empty(o.q.shape()), dk0 = Tensor::empty(o.k.shape()),
         dv0 = Tensor::empty(o.v.shape());
  Tensor dq1 = Tensor::empty(o.q.shape()), dk1 = Tensor::empty(o.k.shape()),
         dv1 = Tensor::empty(o.v.shape()), dsinks = Tensor::zeros({4});
  ops::attention_backward(o.dctx, o.q, o.k, o.v, p0, s, dq0, dk0, dv0);
  ops::attention_backward(o.dctx, o.q, o.k, o.v, p1, s, dq1, dk1, dv1, none, &dsinks);
  CHECK(test::bitwise_equal(dq0, dq1));
  CHECK(test::bitwise_equal(dk0, dk1));
  CHECK(test::bitwise_equal(dv0, dv1));
  // |g_ij| = |dctx_i . v_j| <= hd * max|dctx| * max|v|, with the normal(0, 1) values of these
  // seeds within 8 (checked): hd * 64. A row's share: sum_j p_ij is 1 within (2T + 4) * 2^-24
  // (a common factor 1/Z rounded over T terms, each p_ij's own 2 roundings, the sum's T).
  for (const Tensor* t : {&o.dctx, &o.v})
    for (float x : t->to_vector()) REQUIRE(std::fabs(x) < 8.0f);
  const double row_share = (2.0 * s.seq + 4) * 0x1p-24, max_g = s.head_dim * 64.0;
  const double bound = double(s.batch * s.seq) * row_share * max_g;
  for (float g : dsinks.to_vector()) CHECK(std::fabs(g) <= bound);
}

// Finite differences (test::check_gradient: central, step 1e-2, normalised by the largest numeric
// derivative) of loss = sum ctx . r through the f32 op, with sinks that take shares of O(0.1-0.8).
// Tolerance 2e-3: the loss carries the f32 rounding of the contexts a perturbation moves (up to
// N*hd of them, ~(T + hd) ulps each: ~1e-5 absolute), / 2e-2 gives ~5e-4 of gradients of O(1);
// the step's truncation error eps^2/6 |L'''| is ~2e-5 |L'''|: at most ~1e-3 (7e-5 seen). The
// analytic sinks' gradient is also held to the derived formula in double (1e-5 relative: sums of
// T*B row terms of O(1), each within ~(T + hd) ulps).
TEST_CASE("attention sinks: gradients of q, k, v and sinks by finite differences", "[sinks]") {
  for (const ops::AttentionShape& s :
       {ops::AttentionShape{2, 7, 4, 2, 4, 0}, ops::AttentionShape{2, 7, 4, 2, 4, 3},
        ops::AttentionShape{1, 30, 4, 1, 8, 9}}) {
    INFO("T " << s.seq << " KV " << s.kv_heads << " window " << s.window);
    Operands o(s, 100);
    const int64_t n = s.batch * s.seq, ldq = s.heads * s.head_dim;
    Tensor sinks = sinks_tensor({-0.5f, 0.3f, 1.2f, 2.0f});
    Tensor probs = Tensor::empty({s.batch, s.heads, s.seq, s.seq}), ctx = Tensor::empty({n, ldq});
    auto loss = [&] {
      ops::attention_forward(o.q, o.k, o.v, s, probs, ctx, sinks);
      return test::dot(ctx, o.dctx);
    };
    loss();
    Tensor dq = Tensor::empty(o.q.shape()), dk = Tensor::empty(o.k.shape()),
           dv = Tensor::empty(o.v.shape());
    const std::vector<float> start{0.25f, -1.0f, 0.0f, 3.0f};
    Tensor dsinks = sinks_tensor(start);  // accumulated into
    ops::attention_backward(o.dctx, o.q, o.k, o.v, probs, s, dq, dk, dv, sinks, &dsinks);
    Tensor added = Tensor::empty({4});
    for (int64_t h = 0; h < 4; ++h)
      added.data<float>()[h] = dsinks.data<float>()[h] - start[static_cast<size_t>(h)];
    const std::vector<double> want =
        reference_sink_grad(reference(o.q, o.k, o.v, sinks.to_vector(), s), o.dctx, o.v, s);
    double scale = 0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    for (int64_t h = 0; h < 4; ++h) {
      INFO("head " << h << ": " << added.data<float>()[h] << " vs " << want[h]);
      CHECK(std::fabs(added.data<float>()[h] - want[h]) <= 1e-5 * scale);
    }
    MOE_REQUIRE_GRAD(test::check_gradient(o.q, dq, loss), 2e-3);
    MOE_REQUIRE_GRAD(test::check_gradient(o.k, dk, loss), 2e-3);
    MOE_REQUIRE_GRAD(test::check_gradient(o.v, dv, loss), 2e-3);
    MOE_REQUIRE_GRAD(test::check_gradient(sinks, added, loss), 2e-3);
  }
}

TEST_CASE("attention sinks: bad sinks are refused by name", "[sinks]") {
  const ops::AttentionShape s{1, 4, 4, 2, 4, 0};
  const Operands o(s, 110);
  Tensor probs = Tensor::empty({1, 4, 4, 4}), ctx = Tensor::empty({4, 16});
  REQUIRE_THROWS_WITH(ops::attention_forward(o.q, o.k, o.v, s, probs, ctx, Tensor::zeros({3})),
                      Catch::Contains("one logit for each of the 4 query heads"));
  Tensor dq = Tensor::empty(o.q.shape()), dk = Tensor::empty(o.k.shape()),
         dv = Tensor::empty(o.v.shape()), dsinks = Tensor::zeros({4});
  REQUIRE_THROWS_WITH(
      ops::attention_backward(o.dctx, o.q, o.k, o.v, probs, s, dq, dk, dv, Tensor(), &dsinks),
      Catch::Contains("without the sinks"));
  nn::AttentionConfig c;
  c.d_model = 16;
  c.heads = 4;
  c.sinks = true;
  c.mla.kv_lora_rank = 8;
  c.mla.qk_nope = 4;
  c.mla.qk_rope = 4;
  c.mla.v_head_dim = 4;
  ParamSet ps(1);
  REQUIRE_THROWS_WITH(nn::Attention(ps, "attn", c),
                      Catch::Contains("sinks do not combine with latent attention"));
}

namespace {

nn::AttentionConfig sink_config(int64_t window) {
  nn::AttentionConfig c;
  c.d_model = 16;
  c.heads = 4;
  c.kv_heads = 2;
  c.rope = true;
  c.rope_theta = 100.0f;
  c.qkv_bias = true;
  c.o_bias = true;
  c.window = window;
  c.sinks = true;
  return c;
}

void randomize(ParamSet& ps, uint64_t seed) {
  for (Param* p : ps.all()) test::randomize_param(*p, seed++, 0.4f);
}

void set_sinks(ParamSet& ps, const std::vector<float>& values) {
  Param& p = ps.at("attn.sinks");
  for (size_t h = 0; h < values.size(); ++h) p.value.data<float>()[h] = values[h];
  p.refresh_compute();
}

double relative_gap(const Tensor& got, const Tensor& want) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    diff = std::max(diff, double(std::fabs(got.data<float>()[i] - want.data<float>()[i])));
    scale = std::max(scale, double(std::fabs(want.data<float>()[i])));
  }
  REQUIRE(scale > 0.01);
  return diff / scale;
}

}  // namespace

// The parameter: its name (HF's self_attn.sinks maps onto <layer>.attn.sinks), f32 in a bf16
// model too, zeros, no decay; its gradient through the layer by finite differences (1e-2, as the
// window tests' layer check: the projections, RoPE and biases add their roundings to the loss;
// 2e-4 seen); and an AdamW step moves it.
TEST_CASE("attention sinks: the layer's parameter trains like any other", "[sinks]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    ParamSet ps(5, dtype);
    nn::Attention attention(ps, "attn", sink_config(3));
    Param& sinks = ps.at("attn.sinks");
    CHECK(sinks.shape == Shape{4});
    CHECK(sinks.value.dtype() == DType::f32);
    CHECK_FALSE(sinks.decay);
    for (float x : sinks.value.to_vector()) CHECK(x == 0.0f);
  }
  ParamSet ps(5);
  nn::Attention attention(ps, "attn", sink_config(3));
  randomize(ps, 500);
  set_sinks(ps, {-0.4f, 0.2f, 0.9f, 1.6f});
  const int64_t batch = 2, seq = 7, n = batch * seq;
  Tensor x = test::random_tensor({n, 16}, 8), r = test::random_tensor({n, 16}, 9);
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
  Param& sinks = ps.at("attn.sinks");
  const std::vector<float> before = sinks.value.to_vector();
  optim::AdamW adamw(ps, optim::AdamWConfig{});
  adamw.step(1e-2f);
  const std::vector<float> after = sinks.value.to_vector();
  for (size_t h = 0; h < before.size(); ++h) CHECK(after[h] != before[h]);
}

// Prefill then single tokens through the cache (the decode loops; with a window, past it) against
// the uncached forwards: the whole prompt at once is inference's own path (bitwise), the steps
// within 1e-5 of the scale (the decode products sum in another order). The sinks matter: with
// them pushed to -1e30 the outputs move by O(0.1).
TEST_CASE("attention sinks: the cached forward equals the uncached one", "[sinks]") {
  for (int64_t window : {0, 3}) {
    INFO("window " << window);
    ParamSet ps(6);
    nn::Attention attention(ps, "attn", sink_config(window));
    randomize(ps, 600);
    set_sinks(ps, {-1.0f, 0.5f, 1.5f, 3.0f});
    const int64_t T = 10;
    Tensor x = test::random_tensor({T, 16}, 61);
    const Tensor full = attention.forward(x, 1, T, nullptr);
    nn::Attention::Saved saved;
    CHECK(relative_gap(attention.forward(x, 1, T, &saved), full) <= 1e-5);
    nn::AttentionCache whole = attention.make_cache(1, T);
    CHECK(test::bitwise_equal(attention.forward_cached(x, ops::CachedRows{{0}, {0}, {T}}, whole),
                              full));
    nn::AttentionCache cache = attention.make_cache(2, T);
    const Tensor prefill = attention.forward_cached(x.rows(0, 4), {{1}, {0}, {4}}, cache);
    CHECK(relative_gap(prefill, full.rows(0, 4).clone()) <= 1e-5);
    for (int64_t t = 4; t < T; ++t) {
      INFO("position " << t);
      const Tensor step =
          attention.forward_cached(x.rows(t, t + 1).clone(), {{1}, {t}, {1}}, cache);
      CHECK(relative_gap(step, full.rows(t, t + 1).clone()) <= 1e-5);
    }
    set_sinks(ps, std::vector<float>(4, -1e30f));
    CHECK(relative_gap(attention.forward(x, 1, T, nullptr), full) > 1e-2);
  }
}

// Saved and loaded as any parameter: the checkpoint holds attn.sinks [4] f32, the loader's check
// accepts it for a fresh layer, and the loaded layer gives the saved one's bits.
TEST_CASE("attention sinks: the parameter goes through a checkpoint", "[sinks]") {
  test::ScratchDir dir("attention_sinks_checkpoint");
  ParamSet ps(7);
  nn::Attention attention(ps, "attn", sink_config(0));
  randomize(ps, 700);
  io::Checkpoint ckpt;
  for (Param* p : ps.all()) ckpt.params.push_back({p->name, p->value, p->expert, p->shard});
  io::save_checkpoint(dir / "sinks.h5", ckpt);
  CHECK(io::read_param(dir / "sinks.h5", "attn.sinks").dtype() == DType::f32);
  const io::Checkpoint back = io::load_checkpoint(dir / "sinks.h5");
  ParamSet fresh(8);
  nn::Attention loaded(fresh, "attn", sink_config(0));
  io::check_params_match(fresh, back.params, "test");
  for (const io::NamedTensor& nt : back.params) {
    Param& p = fresh.at(nt.name);
    p.value.copy_from(nt.whole());
    p.refresh_compute();
  }
  CHECK(test::bitwise_equal(fresh.at("attn.sinks").value, ps.at("attn.sinks").value));
  Tensor x = test::random_tensor({6, 16}, 71);
  CHECK(test::bitwise_equal(loaded.forward(x, 1, 6, nullptr), attention.forward(x, 1, 6, nullptr)));
}

namespace {

void cpu_batched(const cuda::BatchedGemm& g) {
  for (int64_t i = 0; i < g.batch; ++i)
    cpu::sgemm(g.transpose_a, g.transpose_b, g.m, g.n, g.k, g.alpha, g.a + i * g.stride_a, g.lda,
               g.b + i * g.stride_b, g.ldb, g.beta, g.c + i * g.stride_c, g.ldc);
}

}  // namespace

// The CUDA op's steps with the sink bodies on odd grids and CPU GEMMs: the forward and backward
// give the CPU op's bits (the same kernels::causal_softmax_sink_row, sink_gradient_row and
// sink_gradient_sum bodies, the same products), the cached steps within 1e-6 (the CPU decodes a
// single new token by plain loops, another order of the same sums; values of O(1)).
TEST_CASE("attention sinks: the CUDA kernel bodies match the CPU op", "[sinks][cuda-harness]") {
  const std::vector<float> sinks{-2.0f, 0.5f, 1.0f, 30.0f};
  for (const ops::AttentionShape& a :
       {ops::AttentionShape{2, 7, 4, 2, 5, 0}, ops::AttentionShape{2, 9, 4, 1, 6, 3}}) {
    const Operands o(a, 120);
    const int64_t n = a.batch * a.seq, ldq = a.heads * a.head_dim;
    const Shape ps{a.batch, a.heads, a.seq, a.seq};
    Tensor probs = Tensor::empty(ps), ctx = Tensor::empty({n, ldq});
    ops::attention_forward(o.q, o.k, o.v, a, probs, ctx, sinks_tensor(sinks));
    Tensor dq = Tensor::empty(o.q.shape()), dk = Tensor::empty(o.k.shape()),
           dv = Tensor::empty(o.v.shape()), dsinks = sinks_tensor({1.0f, 2.0f, 3.0f, 4.0f});
    ops::attention_backward(o.dctx, o.q, o.k, o.v, probs, a, dq, dk, dv, sinks_tensor(sinks),
                            &dsinks);
    const float scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
    const std::vector<float> q = o.q.to_vector(), k = o.k.to_vector(), v = o.v.to_vector(),
                             dctx = o.dctx.to_vector();
    for (auto grid : test::kHarnessGrids) {
      INFO("T " << a.seq << " window " << a.window << " grid " << grid.blocks << "x"
                << grid.threads);
      std::vector<float> p(probs.numel(), -7.0f), c(ctx.numel(), -7.0f);
      auto softmax = [&](float* scores, int64_t rows, int64_t queries, int64_t keys, int64_t start,
                         int64_t window) {
        cuda::run_grid_on_cpu<cuda::body::CausalSoftmaxSinkRows>(
            grid, scores, rows, queries, keys, start, window, sinks.data(), a.heads);
      };
      cuda::attention_forward_steps(q.data(), k.data(), v.data(), p.data(), c.data(), a.batch,
                                    a.seq, a.heads, a.kv_heads, a.head_dim, scale, a.window,
                                    cpu_batched, softmax);
      REQUIRE(p == probs.to_vector());
      REQUIRE(c == ctx.to_vector());
      // attention.cu's SoftmaxBackwardLaunch: the rows' sink terms, the rows' backward, the sums.
      std::vector<float> ds(probs.numel()), gq(q.size()), gk(k.size()), gv(v.size()),
          terms(static_cast<size_t>(a.batch * a.heads * a.seq), -7.0f), gs{1.0f, 2.0f, 3.0f, 4.0f};
      auto backward = [&](const float* pr, float* d, int64_t rows, int64_t seq, float sc) {
        cuda::run_grid_on_cpu<cuda::body::SinkGradientRows>(grid, pr, static_cast<const float*>(d),
                                                            terms.data(), rows, seq);
        cuda::run_grid_on_cpu<cuda::body::CausalSoftmaxBackwardRows>(grid, pr, d, rows, seq, sc);
        cuda::run_grid_on_cpu<cuda::body::SinkGradientSum>(
            grid, static_cast<const float*>(terms.data()), a.batch, a.heads, seq, gs.data());
      };
      const std::vector<float> pv = probs.to_vector();
      cuda::attention_backward_steps(dctx.data(), q.data(), k.data(), v.data(), pv.data(),
                                     ds.data(), gq.data(), gk.data(), gv.data(), a.batch, a.seq,
                                     a.heads, a.kv_heads, a.head_dim, scale, cpu_batched, backward);
      REQUIRE(gq == dq.to_vector());
      REQUIRE(gk == dk.to_vector());
      REQUIRE(gv == dv.to_vector());
      REQUIRE(gs == dsinks.to_vector());
    }
  }
  // Cached: three rows (a prefill from 0, a chunk after cached positions, a decode token).
  const int64_t H = 4, KV = 2, hd = 6, slots = 3, capacity = 10;
  ops::CachedRows rows{{2, 0, 1}, {0, 4, 9}, {3, 2, 1}};
  const Shape qs{rows.tokens(), H * hd}, cs{slots, capacity, KV * hd};
  const std::vector<float> q = test::random_tensor(qs, 130).to_vector(),
                           kc = test::random_tensor(cs, 131).to_vector(),
                           vc = test::random_tensor(cs, 132).to_vector();
  for (int64_t window : {0, 4}) {
    rows.window = window;
    Tensor want = Tensor::empty(qs);
    ops::attention_forward_cached(Tensor::from_vector(qs, q), Tensor::from_vector(cs, kc),
                                  Tensor::from_vector(cs, vc), H, KV, rows, want,
                                  sinks_tensor(sinks));
    for (auto grid : test::kHarnessGrids) {
      INFO("window " << window << " grid " << grid.blocks << "x" << grid.threads);
      std::vector<float> c(static_cast<size_t>(want.numel()), -7.0f), scores(H * 6 * 6, -7.0f);
      auto softmax = [&](float* s, int64_t r, int64_t queries, int64_t keys, int64_t start,
                         int64_t w) {
        cuda::run_grid_on_cpu<cuda::body::CausalSoftmaxSinkRows>(grid, s, r, queries, keys, start,
                                                                 w, sinks.data(), H);
      };
      cuda::attention_cached_steps(
          q.data(), kc.data(), vc.data(), c.data(), scores.data(), rows.slot.data(),
          rows.start.data(), rows.count.data(), rows.rows(), H, KV, hd, capacity,
          1.0f / std::sqrt(static_cast<float>(hd)), window, cpu_batched, softmax);
      const std::vector<float> w = want.to_vector();
      for (size_t i = 0; i < w.size(); ++i) {
        INFO("index " << i);
        REQUIRE(std::fabs(double(c[i]) - w[i]) <= 1e-6 * std::max(1.0, std::fabs(double(w[i]))));
      }
    }
  }
}
