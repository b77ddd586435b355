// Dense-layer ops against straightforward double-precision loops, error messages for bad
// shapes and ids, parameter layout of the layers, and thread-count independence.
// Shape letters: N tokens, B batch, T sequence, D features, H heads, KV kv heads, hd head dim,
// V vocabulary, F hidden.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "moe/nn/attention.h"
#include "moe/nn/embedding.h"
#include "moe/nn/linear.h"
#include "moe/nn/loss.h"
#include "moe/nn/mlp.h"
#include "moe/nn/norm.h"
#include "moe/ops/dense.h"
#include "moe/param.h"
#include "moe/threads.h"
#include "support/bits.h"
#include "support/gradcheck.h"

using namespace moe;

namespace {

// |a - b| within rel * max(1, |b|)
void require_close(float a, double b, double rel) {
  INFO("got " << a << " expected " << b);
  REQUIRE(std::fabs(a - b) <= rel * std::max(1.0, std::fabs(b)));
}

// y = rope(x) by the rotate-half formula in double: rows are [batch * seq, heads * hd], row
// (b, t) at position offset + t.
void check_rope(const Tensor& x, const Tensor& y, int64_t batch, int64_t seq, int64_t heads,
                int64_t offset, float theta) {
  const int64_t width = x.dim(1), hd = width / heads;
  const float* xs = x.data<float>();
  const float* ys = y.data<float>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < hd / 2; ++i) {
          const double angle = (offset + t) * std::pow(static_cast<double>(theta), -2.0 * i / hd);
          const int64_t base = (b * seq + t) * width + h * hd;
          const double x1 = xs[base + i], x2 = xs[base + i + hd / 2];
          require_close(ys[base + i], x1 * std::cos(angle) - x2 * std::sin(angle), 1e-5);
          require_close(ys[base + i + hd / 2], x2 * std::cos(angle) + x1 * std::sin(angle), 1e-5);
        }
}

using test::bitwise_equal;
using test::ThreadGuard;

}  // namespace

TEST_CASE("dense: layernorm and rmsnorm match the formula", "[dense]") {
  const int64_t n = 6, d = 37;
  Tensor x = test::random_tensor({n, d}, 21, 2.0f);
  float* xs = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) xs[i] += 5.0f;  // offset: the mean must be removed
  Tensor w = test::random_tensor({d}, 22), b = test::random_tensor({d}, 23);
  const float eps = 1e-5f;
  Tensor y = Tensor::empty({n, d}), mean = Tensor::empty({n}), rstd = Tensor::empty({n});
  ops::layernorm_forward(x, w, b, eps, y, &mean, &rstd);
  Tensor y_rms = Tensor::empty({n, d}), rstd_rms = Tensor::empty({n});
  ops::rmsnorm_forward(x, w, eps, y_rms, &rstd_rms);
  Tensor y_nosave = Tensor::empty({n, d});
  ops::layernorm_forward(x, w, b, eps, y_nosave, nullptr, nullptr);
  REQUIRE(bitwise_equal(y, y_nosave));
  for (int64_t i = 0; i < n; ++i) {
    double m = 0, v = 0, sq = 0;
    for (int64_t j = 0; j < d; ++j) m += xs[i * d + j];
    m /= d;
    for (int64_t j = 0; j < d; ++j) {
      v += (xs[i * d + j] - m) * (xs[i * d + j] - m);
      sq += static_cast<double>(xs[i * d + j]) * xs[i * d + j];
    }
    v /= d;
    const double r = 1.0 / std::sqrt(v + eps), r_rms = 1.0 / std::sqrt(sq / d + eps);
    require_close(mean.data<float>()[i], m, 1e-5);
    require_close(rstd.data<float>()[i], r, 1e-4);
    require_close(rstd_rms.data<float>()[i], r_rms, 1e-5);
    for (int64_t j = 0; j < d; ++j) {
      const double wj = w.data<float>()[j], bj = b.data<float>()[j];
      require_close(y.data<float>()[i * d + j], (xs[i * d + j] - m) * r * wj + bj, 1e-4);
      require_close(y_rms.data<float>()[i * d + j], xs[i * d + j] * r_rms * wj, 1e-5);
    }
  }
}

TEST_CASE("dense: rope matches the rotate-half formula and inverts", "[dense]") {
  const int64_t batch = 2, seq = 5, heads = 3, hd = 8, offset = 7;
  const float theta = 10000.0f;
  Tensor x = test::random_tensor({batch * seq, heads * hd}, 24);
  Tensor y = Tensor::empty(x.shape());
  ops::rope_forward(x, batch, seq, heads, theta, y, offset);
  check_rope(x, y, batch, seq, heads, offset, theta);
  const float* xs = x.data<float>();
  // The backward is the inverse rotation; in place gives the same bits as out of place.
  Tensor back = Tensor::empty(x.shape());
  ops::rope_backward(y, batch, seq, heads, theta, back, offset);
  for (int64_t i = 0; i < x.numel(); ++i) require_close(back.data<float>()[i], xs[i], 1e-5);
  Tensor in_place = x.clone();
  ops::rope_forward(in_place, batch, seq, heads, theta, in_place, offset);
  REQUIRE(bitwise_equal(in_place, y));
  // Position 0 is the identity.
  Tensor first = x.rows(0, 1).clone(), first_y = Tensor::empty(first.shape());
  ops::rope_forward(first, 1, 1, heads, theta, first_y);
  REQUIRE(bitwise_equal(first, first_y));
  Tensor odd = test::random_tensor({2, 6}, 25);
  REQUIRE_THROWS_WITH(ops::rope_forward(odd, 1, 2, 2, theta, odd), Catch::Contains("odd"));
  // Rows enough for the parallel loop (64 x 512 values), on 2 threads: the workers rotate with
  // the calling thread's cos/sin table, not with their own.
  ThreadGuard guard;
  set_num_threads(2);
  Tensor wide = test::random_tensor({64, 8 * 64}, 27), wide_y = Tensor::empty(wide.shape());
  ops::rope_forward(wide, 1, 64, 8, theta, wide_y, offset);
  check_rope(wide, wide_y, 1, 64, 8, offset, theta);
}

// The CPU keeps the last call's cos/sin table (a decode step rotates q and k of every layer at the
// same positions): a call that differs from the one before in any of positions, length, head width
// or theta must still get its own angles.
TEST_CASE("dense: rope after a call at other positions, lengths, widths or theta", "[dense]") {
  struct Call {
    int64_t seq, heads, offset;
    float theta;
  };
  const int64_t width = 24;
  const Call calls[] = {{2, 3, 7, 10000.0f}, {2, 3, 8, 10000.0f}, {3, 3, 8, 10000.0f},
                        {3, 6, 8, 10000.0f}, {3, 6, 8, 500.0f},   {2, 3, 7, 10000.0f}};
  Tensor first;
  for (const Call& c : calls) {
    INFO("seq " << c.seq << " heads " << c.heads << " offset " << c.offset << " theta " << c.theta);
    Tensor x = test::random_tensor({c.seq, width}, 26), y = Tensor::empty(x.shape());
    ops::rope_forward(x, 1, c.seq, c.heads, c.theta, y, c.offset);
    check_rope(x, y, 1, c.seq, c.heads, c.offset, c.theta);
    if (!first.defined()) {
      first = y;
    } else if (&c == &calls[5]) {  // the first call again: the same bits
      REQUIRE(bitwise_equal(y, first));
    }
  }
}

TEST_CASE("dense: causal GQA attention matches a naive triple loop", "[dense]") {
  // T 100: the op cuts each head's products into 4 blocks of 32 query rows that skip what lies
  // above the diagonal (backend/cpu/attention.cpp); T 7 is one block.
  for (const ops::AttentionShape& s :
       {ops::AttentionShape{2, 7, 4, 2, 8}, ops::AttentionShape{1, 100, 4, 2, 16}}) {
    INFO("T " << s.seq);
    const int64_t n = s.batch * s.seq, group = s.heads / s.kv_heads;
    Tensor q = test::random_tensor({n, s.heads * s.head_dim}, 26);
    Tensor k = test::random_tensor({n, s.kv_heads * s.head_dim}, 27);
    Tensor v = test::random_tensor({n, s.kv_heads * s.head_dim}, 28);
    Tensor probs = Tensor::empty({s.batch, s.heads, s.seq, s.seq});
    Tensor ctx = Tensor::empty(q.shape());
    ops::attention_forward(q, k, v, s, probs, ctx);
    const float* qs = q.data<float>();
    const float* ks = k.data<float>();
    const float* vs = v.data<float>();
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < s.seq; ++i) {
          const int64_t g = h / group;
          std::vector<double> p(s.seq, 0.0);
          double mx = -1e300, sum = 0;
          for (int64_t j = 0; j <= i; ++j) {
            double dot = 0;
            for (int64_t c = 0; c < s.head_dim; ++c)
              dot += static_cast<double>(
                         qs[(b * s.seq + i) * s.heads * s.head_dim + h * s.head_dim + c]) *
                     ks[(b * s.seq + j) * s.kv_heads * s.head_dim + g * s.head_dim + c];
            p[j] = dot * scale;
            mx = std::max(mx, p[j]);
          }
          for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
          for (int64_t j = 0; j <= i; ++j) p[j] /= sum;
          const float* prow = probs.data<float>() + ((b * s.heads + h) * s.seq + i) * s.seq;
          for (int64_t j = 0; j < s.seq; ++j) {
            if (j > i)
              REQUIRE(prow[j] == 0.0f);
            else
              require_close(prow[j], p[j], 1e-5);
          }
          for (int64_t c = 0; c < s.head_dim; ++c) {
            // Each p within 1e-5 (above) moves the sum by at most 1e-5 sum p |v|; the fp32 sum of
            // i + 1 terms adds at most (i + 3) u sum p |v| (u = 2^-24).
            double o = 0, magnitude = 0;
            for (int64_t j = 0; j <= i; ++j) {
              const double vj = vs[(b * s.seq + j) * s.kv_heads * s.head_dim + g * s.head_dim + c];
              o += p[j] * vj;
              magnitude += p[j] * std::fabs(vj);
            }
            const float got =
                ctx.data<float>()[(b * s.seq + i) * s.heads * s.head_dim + h * s.head_dim + c];
            INFO("ctx " << got << " expected " << o);
            REQUIRE(std::fabs(got - o) <= (1e-5 + (i + 3) * 0x1p-24) * std::max(1.0, magnitude));
          }
        }
  }
  // Wrong operand shape: the message names the tensor.
  const ops::AttentionShape s{2, 7, 4, 2, 8};
  Tensor q = test::random_tensor({14, 32}, 26), v = test::random_tensor({14, 16}, 28);
  Tensor probs = Tensor::empty({2, 4, 7, 7}), ctx = Tensor::empty(q.shape());
  Tensor bad = test::random_tensor({14, 3}, 29).set_name("blocks.0.attn.k");
  REQUIRE_THROWS_WITH(ops::attention_forward(q, bad, v, s, probs, ctx),
                      Catch::Contains("blocks.0.attn.k[14,3]"));
}

TEST_CASE("dense: attention by query blocks gives attention_forward's context", "[dense]") {
  // Inference runs attention a block of query rows at a time, each block against only the keys it
  // sees (no [B,H,T,T] probabilities). Blocks of 1 row (the decode path's loops), 16 and 64 rows
  // (a last block shorter than the others), the whole window, and more rows than the window (all
  // windows in one call). attention_forward's context and the blocks' are each within the bound
  // of the test above of the same fp64 value; |p V| <= max |v| since p sums to 1, so they differ
  // by at most twice that bound at magnitude max |v|.
  const ops::AttentionShape s{2, 70, 4, 2, 8};
  const int64_t n = s.batch * s.seq;
  Tensor q = test::random_tensor({n, 32}, 40), k = test::random_tensor({n, 16}, 41),
         v = test::random_tensor({n, 16}, 42);
  Tensor probs = Tensor::empty({s.batch, s.heads, s.seq, s.seq}), full = Tensor::empty({n, 32});
  ops::attention_forward(q, k, v, s, probs, full);
  float v_max = 0;
  for (int64_t i = 0; i < v.numel(); ++i) v_max = std::max(v_max, std::fabs(v.data<float>()[i]));
  const double tolerance = 2 * (1e-5 + (s.seq + 3) * 0x1p-24) * std::max(1.0f, v_max);
  for (int64_t rows : {1, 16, 64, 70, 100}) {
    INFO("block rows " << rows);
    Tensor ctx = Tensor::empty({n, 32});
    ops::attention_forward_blocks(q, k, v, s, rows, ctx);
    double worst = 0;
    for (int64_t i = 0; i < n * 32; ++i)
      worst = std::max(worst, double(std::fabs(ctx.data<float>()[i] - full.data<float>()[i])));
    INFO("largest difference " << worst);
    REQUIRE(worst <= tolerance);
  }
  Tensor ctx = Tensor::empty({n, 32});
  REQUIRE_THROWS_WITH(ops::attention_forward_blocks(q, k, v, s, 0, ctx),
                      Catch::Contains("0 query rows a block"));
}

TEST_CASE("dense: attention backward matches finite differences of the core op", "[dense]") {
  // T 40: two blocks of query rows (32 and 8), each product cut at the diagonal.
  for (const ops::AttentionShape& s :
       {ops::AttentionShape{2, 5, 4, 2, 4}, ops::AttentionShape{1, 40, 4, 2, 4}}) {
    INFO("T " << s.seq);
    const int64_t n = s.batch * s.seq;
    Tensor q = test::random_tensor({n, 16}, 30), k = test::random_tensor({n, 8}, 31),
           v = test::random_tensor({n, 8}, 32), r = test::random_tensor({n, 16}, 33);
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

TEST_CASE("dense: cross_entropy at V = 70,000 is unbiased against fp64", "[dense]") {
  // A large vocabulary with O(1)-scale logits (HF-imported models have V = 32k-150k): the sum of
  // exp(x - max) runs over 70,000 terms. The fp32 exps are each within ~1 ulp, so the fp64
  // logsumexp differs from ours by about 1.2e-7 (the terms' own rounding) plus the final rounding
  // of nll (~12 here: 1 ulp = 9.5e-7). We allow 2e-6 per row and 2e-7 for the mean over rows
  // (rounding errors of random sign average out; a bias does not). An fp32 running sum was
  // ~8e-5 too high on every row at this V.
  const int64_t n = 16, vocab = 70000;
  Tensor logits = test::random_tensor({n, vocab}, 35, 1.0f);
  std::vector<int32_t> target_ids;
  for (int64_t i = 0; i < n; ++i) target_ids.push_back(static_cast<int32_t>((i * 4111) % vocab));
  Tensor targets = Tensor::from_vector({n}, target_ids);
  Tensor dlogits, row_nll;
  nn::cross_entropy(logits, targets, &dlogits, 1.0f, &row_nll);
  const float* x = logits.data<float>();
  double bias = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = x + i * vocab;
    double mx = row[0], sum = 0;
    for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, static_cast<double>(row[j]));
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(row[j] - mx);
    const double want = mx + std::log(sum) - row[target_ids[i]];
    const double got = row_nll.data<float>()[i];
    INFO("row " << i << " nll " << got << " fp64 " << want);
    REQUIRE(std::fabs(got - want) <= 2e-6);
    bias += (got - want) / n;
    // The gradient is softmax - onehot over rows' mean: check one row's softmax mass.
    double mass = 0;
    for (int64_t j = 0; j < vocab; ++j) mass += dlogits.data<float>()[i * vocab + j];
    REQUIRE(std::fabs(mass) <= 1e-6);  // sum_j (p_j - [j == t]) / n = 0
  }
  CHECK(std::fabs(bias) <= 2e-7);
}

TEST_CASE("dense: cross_entropy matches log-softmax in double", "[dense]") {
  const int64_t n = 5, vocab = 11;
  Tensor logits = test::random_tensor({n, vocab}, 34, 3.0f);
  logits.data<float>()[7] = 60.0f;  // a large logit: max-subtraction keeps exp finite
  Tensor targets = Tensor::from_vector({n}, std::vector<int32_t>{3, -1, 10, 0, 7});
  Tensor dlogits, row_nll;
  const float scale = 0.5f;
  const double loss = nn::cross_entropy(logits, targets, &dlogits, scale, &row_nll);
  const float* x = logits.data<float>();
  double total = 0;
  int counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = targets.data<int32_t>()[i];
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, static_cast<double>(x[i * vocab + j]));
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(x[i * vocab + j] - mx);
    const double lse = mx + std::log(sum);
    if (t < 0) {
      REQUIRE(row_nll.data<float>()[i] == 0.0f);
      for (int64_t j = 0; j < vocab; ++j) REQUIRE(dlogits.data<float>()[i * vocab + j] == 0.0f);
      continue;
    }
    require_close(row_nll.data<float>()[i], lse - x[i * vocab + t], 1e-5);
    total += lse - x[i * vocab + t];
    ++counted;
  }
  REQUIRE(std::isfinite(loss));
  require_close(static_cast<float>(loss), total / counted, 1e-5);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = targets.data<int32_t>()[i];
    if (t < 0) continue;
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, static_cast<double>(x[i * vocab + j]));
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(x[i * vocab + j] - mx);
    for (int64_t j = 0; j < vocab; ++j) {
      const double p = std::exp(x[i * vocab + j] - mx) / sum;
      require_close(dlogits.data<float>()[i * vocab + j], scale * (p - (j == t)) / counted, 1e-6);
    }
  }
  // All rows ignored: loss 0, gradient 0.
  Tensor none = Tensor::from_vector({n}, std::vector<int32_t>{-1, -1, -1, -1, -1});
  REQUIRE(nn::cross_entropy(logits, none, &dlogits) == 0.0);
  for (int64_t i = 0; i < logits.numel(); ++i) REQUIRE(dlogits.data<float>()[i] == 0.0f);
  // A target past the vocabulary names it.
  Tensor bad = Tensor::from_vector({n}, std::vector<int32_t>{3, 11, 0, 0, 0}).set_name("targets");
  REQUIRE_THROWS_WITH(nn::cross_entropy(logits, bad, nullptr),
                      Catch::Contains("target 11") && Catch::Contains("targets[5]"));
  Tensor wrong_rows =
      Tensor::from_vector({2}, std::vector<int32_t>{0, 1}).set_name("short_targets");
  REQUIRE_THROWS_WITH(nn::cross_entropy(logits, wrong_rows, nullptr),
                      Catch::Contains("short_targets[2]"));
}

TEST_CASE("dense: embedding gathers rows, sums repeats, and names bad ids", "[dense]") {
  ParamSet ps(3);
  nn::Embedding embedding(ps, "wte", 6, 5, 1.0f);
  REQUIRE(embedding.table().name == "wte");
  REQUIRE_FALSE(embedding.table().decay);
  Tensor ids = Tensor::from_vector({2, 3}, std::vector<int32_t>{5, 0, 5, 2, 2, 5});
  Tensor out = embedding.forward(ids);
  REQUIRE(out.shape() == Shape{6, 5});
  const float* table = embedding.table().w().data<float>();
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 5; ++j)
      REQUIRE(out.data<float>()[i * 5 + j] == table[ids.data<int32_t>()[i] * 5 + j]);
  Tensor dy = test::random_tensor({6, 5}, 35);
  ps.zero_grad();
  embedding.backward(dy, ids);
  embedding.backward(dy, ids);  // accumulates
  std::vector<double> expected(30, 0.0);
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 5; ++j)
      expected[ids.data<int32_t>()[i] * 5 + j] += 2.0 * dy.data<float>()[i * 5 + j];
  for (int64_t e = 0; e < 30; ++e)
    require_close(embedding.table().grad.data<float>()[e], expected[e], 1e-6);

  Tensor too_big = Tensor::from_vector({3}, std::vector<int32_t>{1, 6, 0}).set_name("ids");
  REQUIRE_THROWS_WITH(embedding.forward(too_big),
                      Catch::Contains("id 6") && Catch::Contains("wte[6,5]"));
  Tensor negative = Tensor::from_vector({2}, std::vector<int32_t>{-3, 0});
  REQUIRE_THROWS_WITH(embedding.forward(negative),
                      Catch::Contains("id -3") && Catch::Contains("wte"));
  REQUIRE_THROWS_WITH(embedding.backward(dy.rows(0, 3), too_big), Catch::Contains("id 6"));
  Tensor float_ids = test::random_tensor({3}, 36).set_name("float_ids");
  REQUIRE_THROWS_WITH(embedding.forward(float_ids), Catch::Contains("float_ids[3]"));
}

TEST_CASE("dense: linear, gelu and swiglu match naive loops", "[dense]") {
  ParamSet ps(4);
  nn::Linear linear(ps, "fc", 7, 3, true, 0.5f);
  Tensor& bias = ps.at("fc.bias").value;
  Tensor rb = test::random_tensor({3}, 37);
  bias.copy_from(rb);
  Tensor x = test::random_tensor({4, 7}, 38);
  Tensor y = linear.forward(x);
  const float* w = linear.weight().w().data<float>();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t o = 0; o < 3; ++o) {
      double s = rb.data<float>()[o];
      for (int64_t c = 0; c < 7; ++c)
        s += static_cast<double>(x.data<float>()[i * 7 + c]) * w[o * 7 + c];
      require_close(y.data<float>()[i * 3 + o], s, 1e-5);
    }
  Tensor a = test::random_tensor({3, 5}, 39, 2.0f), u = test::random_tensor({3, 5}, 40);
  Tensor g = Tensor::empty(a.shape()), sw = Tensor::empty(a.shape());
  ops::gelu_forward(a, g);
  ops::swiglu_forward(a, u, sw);
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double xv = a.data<float>()[i];
    const double gelu =
        0.5 * xv * (1 + std::tanh(std::sqrt(2 / M_PI) * (xv + 0.044715 * xv * xv * xv)));
    require_close(g.data<float>()[i], gelu, 1e-5);
    require_close(sw.data<float>()[i], xv / (1 + std::exp(-xv)) * u.data<float>()[i], 1e-5);
  }
}

TEST_CASE("dense: bad shapes throw naming the tensor", "[dense]") {
  ParamSet ps(5);
  nn::Linear linear(ps, "blocks.1.fc", 8, 4, false, 0.02f);
  Tensor x = test::random_tensor({3, 5}, 41).set_name("hidden");
  REQUIRE_THROWS_WITH(linear.forward(x),
                      Catch::Contains("hidden[3,5]") && Catch::Contains("blocks.1.fc"));
  Tensor good = test::random_tensor({3, 8}, 42);
  Tensor dy = test::random_tensor({3, 5}, 43).set_name("dy");
  REQUIRE_THROWS_WITH(linear.backward(dy, good), Catch::Contains("dy[3,5]"));

  nn::Norm norm(ps, "blocks.1.norm1", 8, nn::NormKind::rmsnorm, 1e-6f);
  REQUIRE_THROWS_WITH(norm.forward(x, nullptr),
                      Catch::Contains("hidden[3,5]") && Catch::Contains("blocks.1.norm1"));

  nn::AttentionConfig config;
  config.d_model = 8;
  config.heads = 2;
  nn::Attention attention(ps, "blocks.1.attn", config);
  REQUIRE(attention.config().kv_heads == 2);
  Tensor seq_mismatch = test::random_tensor({6, 8}, 44).set_name("normed");
  REQUIRE_THROWS_WITH(attention.forward(seq_mismatch, 2, 4, nullptr),
                      Catch::Contains("normed[6,8]"));
  config.kv_heads = 3;
  REQUIRE_THROWS_AS(nn::Attention(ps, "bad.attn", config), UsageError);

  Tensor w = test::random_tensor({7}, 45).set_name("ln.weight");
  Tensor y = Tensor::empty({3, 5});
  REQUIRE_THROWS_WITH(ops::rmsnorm_forward(x, w, 1e-5f, y, nullptr),
                      Catch::Contains("ln.weight[7]"));
}

TEST_CASE("dense: layers create the documented parameters", "[dense]") {
  ParamSet ps(6);
  nn::AttentionConfig ac;
  ac.d_model = 16;
  ac.heads = 4;
  ac.kv_heads = 2;
  ac.qkv_bias = true;
  ac.o_bias = true;
  nn::Attention attention(ps, "a", ac);
  REQUIRE(attention.head_dim() == 4);
  REQUIRE(ps.at("a.q.weight").value.shape() == Shape{16, 16});
  REQUIRE(ps.at("a.k.weight").value.shape() == Shape{8, 16});
  REQUIRE(ps.at("a.v.weight").value.shape() == Shape{8, 16});
  REQUIRE(ps.at("a.o.weight").value.shape() == Shape{16, 16});
  REQUIRE(ps.at("a.k.bias").value.shape() == Shape{8});
  REQUIRE_FALSE(ps.at("a.o.bias").decay);
  REQUIRE(ps.at("a.o.weight").decay);

  nn::MlpConfig mc;
  mc.d_model = 6;
  mc.d_ff = 10;
  mc.activation = nn::Activation::swiglu;
  mc.bias = false;
  nn::MLP swiglu(ps, "m", mc);
  REQUIRE(ps.at("m.w1").value.shape() == Shape{10, 6});
  REQUIRE(ps.at("m.w3").value.shape() == Shape{10, 6});
  REQUIRE(ps.at("m.w2").value.shape() == Shape{6, 10});
  REQUIRE(ps.find("m.b1") == nullptr);
  mc.activation = nn::Activation::gelu;
  mc.bias = true;
  nn::MLP gelu(ps, "g", mc);
  REQUIRE(ps.at("g.b1").value.shape() == Shape{10});
  REQUIRE(ps.at("g.b2").value.shape() == Shape{6});
  REQUIRE(ps.find("g.w3") == nullptr);

  nn::Norm ln(ps, "ln", 6, nn::NormKind::layernorm, 1e-5f);
  REQUIRE(ps.at("ln.weight").value.to_vector() == std::vector<float>(6, 1.0f));
  REQUIRE(ps.at("ln.bias").value.to_vector() == std::vector<float>(6, 0.0f));
  REQUIRE_FALSE(ps.at("ln.weight").decay);
  nn::Norm rms(ps, "rms", 6, nn::NormKind::rmsnorm, 1e-5f);
  REQUIRE(ps.find("rms.bias") == nullptr);
}

TEST_CASE("dense: attention, embedding and norm backward do not depend on the thread count",
          "[dense]") {
  ThreadGuard guard;
  struct Result {
    std::vector<Tensor> tensors;
  };
  auto run = [](int threads) {
    set_num_threads(threads);
    Result result;
    ParamSet ps(7);
    nn::AttentionConfig config;
    config.d_model = 128;
    config.heads = 8;
    config.kv_heads = 2;
    config.rope = true;
    nn::Attention attention(ps, "attn", config);
    nn::Norm norm(ps, "norm", 128, nn::NormKind::layernorm, 1e-5f);
    nn::Embedding embedding(ps, "wte", 37, 128, 0.5f);
    // Large enough that every OpenMP loop of these ops runs in parallel (kParallelWork).
    const int64_t batch = 4, seq = 64;
    Tensor ids = test::random_ids({batch * seq}, 50, 37);
    nn::Norm::Saved norm_saved;
    nn::Attention::Saved saved;
    Tensor h = norm.forward(embedding.forward(ids), &norm_saved);
    Tensor y = attention.forward(h, batch, seq, &saved);
    Tensor dy = test::random_tensor(y.shape(), 51);
    ps.zero_grad();
    Tensor dh = attention.backward(dy, saved);
    Tensor de = norm.backward(dh, norm_saved);
    embedding.backward(de, ids);
    // Many tokens on few rows: the embedding scatter has real collisions.
    Tensor many_ids = test::random_ids({4000}, 52, 13);
    Tensor many_dy = test::random_tensor({4000, 24}, 53);
    Tensor table_grad = Tensor::zeros({13, 24});
    ops::embedding_backward(many_dy, many_ids, table_grad);
    result.tensors = {y, dh, de, table_grad};
    for (Param* p : ps.all()) result.tensors.push_back(p->grad.clone());
    return result;
  };
  Result one = run(1), two = run(2);
  REQUIRE(one.tensors.size() == two.tensors.size());
  for (size_t i = 0; i < one.tensors.size(); ++i) {
    INFO("tensor " << i << " " << one.tensors[i].describe());
    REQUIRE(bitwise_equal(one.tensors[i], two.tensors[i]));
  }
}
