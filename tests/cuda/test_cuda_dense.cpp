// [cuda] dense-layer ops on a GPU against the CPU backend, forward and backward: bitwise where the
// GPU does the same float operations in the same order (gathers, sums in a fixed order), else
// within the fp32 tolerance (device expf / tanhf / sinf and FMA contraction differ in the last
// bits).
#include <catch2/catch.hpp>
#include <vector>

#include "moe/cuda.h"
#include "moe/ops/dense.h"
#include "support/cuda.h"
#include "support/gradcheck.h"

using namespace moe;

namespace {

const Device kGpu{Device::cuda, 0};
constexpr double kTolerance = 1e-5;

double error(const Tensor& gpu, const Tensor& cpu) {
  return test::normalised_error(gpu.to_vector(), cpu.to_vector());
}

}  // namespace

TEST_CASE("cuda: embedding forward and backward match the CPU bitwise", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const int64_t rows = 50, dim = 24;
  Tensor table = test::random_tensor({rows, dim}, 1);
  Tensor ids = test::random_ids({4, 33}, 2, 40);  // repeats; ids 40..49 unused
  const int64_t n = ids.numel();
  Tensor out = Tensor::empty({n, dim}), gout = Tensor::empty({n, dim}, DType::f32, kGpu);
  ops::embedding_forward(table, ids, out);
  ops::embedding_forward(table.to(kGpu), ids.to(kGpu), gout);
  REQUIRE(gout.to_vector() == out.to_vector());

  Tensor dy = test::random_tensor({n, dim}, 3);
  Tensor grad = test::random_tensor({rows, dim}, 4);
  Tensor ggrad = grad.to(kGpu);
  ops::embedding_backward(dy, ids, grad);
  ops::embedding_backward(dy.to(kGpu), ids.to(kGpu), ggrad);
  REQUIRE(ggrad.to_vector() == grad.to_vector());

  Tensor bad = Tensor::from_vector({3}, std::vector<int32_t>{1, 50, 0}).set_name("ids");
  Tensor bad_out = Tensor::empty({3, dim}, DType::f32, kGpu);
  REQUIRE_THROWS_WITH(ops::embedding_forward(table.to(kGpu), bad.to(kGpu), bad_out),
                      Catch::Contains("id 50 at position 1"));
  REQUIRE_THROWS_WITH(ops::embedding_backward(dy.rows(0, 3).to(kGpu), bad.to(kGpu), ggrad),
                      Catch::Contains("id 50 at position 1"));
}

TEST_CASE("cuda: layernorm and rmsnorm forward and backward match the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const int64_t n = 45, d = 131;
  Tensor x = test::random_tensor({n, d}, 5, 2.0f), w = test::random_tensor({d}, 6),
         b = test::random_tensor({d}, 7), dy = test::random_tensor({n, d}, 8),
         dw0 = test::random_tensor({d}, 9), db0 = test::random_tensor({d}, 10);
  Tensor gx = x.to(kGpu), gw = w.to(kGpu), gdy = dy.to(kGpu);

  Tensor y = Tensor::empty({n, d}), mean = Tensor::empty({n}), rstd = Tensor::empty({n});
  Tensor gy = Tensor::empty({n, d}, DType::f32, kGpu), gmean = Tensor::empty({n}, DType::f32, kGpu),
         grstd = Tensor::empty({n}, DType::f32, kGpu);
  ops::layernorm_forward(x, w, b, 1e-5f, y, &mean, &rstd);
  ops::layernorm_forward(gx, gw, b.to(kGpu), 1e-5f, gy, &gmean, &grstd);
  CHECK(error(gy, y) <= kTolerance);
  CHECK(error(gmean, mean) <= kTolerance);
  CHECK(error(grstd, rstd) <= kTolerance);
  Tensor dx = Tensor::empty({n, d}), dw = dw0.clone(), db = db0.clone();
  Tensor gdx = Tensor::empty({n, d}, DType::f32, kGpu), gdw = dw0.to(kGpu), gdb = db0.to(kGpu);
  ops::layernorm_backward(dy, x, w, mean, rstd, dx, dw, &db);
  ops::layernorm_backward(gdy, gx, gw, mean.to(kGpu), rstd.to(kGpu), gdx, gdw, &gdb);
  CHECK(error(gdx, dx) <= kTolerance);
  CHECK(error(gdw, dw) <= kTolerance);
  CHECK(error(gdb, db) <= kTolerance);

  Tensor ry = Tensor::empty({n, d}), rr = Tensor::empty({n});
  Tensor gry = Tensor::empty({n, d}, DType::f32, kGpu), grr = Tensor::empty({n}, DType::f32, kGpu);
  ops::rmsnorm_forward(x, w, 1e-6f, ry, &rr);
  ops::rmsnorm_forward(gx, gw, 1e-6f, gry, &grr);
  CHECK(error(gry, ry) <= kTolerance);
  CHECK(error(grr, rr) <= kTolerance);
  Tensor rdx = Tensor::empty({n, d}), rdw = dw0.clone();
  Tensor grdx = Tensor::empty({n, d}, DType::f32, kGpu), grdw = dw0.to(kGpu);
  ops::rmsnorm_backward(dy, x, w, rr, rdx, rdw);
  ops::rmsnorm_backward(gdy, gx, gw, rr.to(kGpu), grdx, grdw);
  CHECK(error(grdx, rdx) <= kTolerance);
  CHECK(error(grdw, rdw) <= kTolerance);
}

TEST_CASE("cuda: bias add, bias gradient, gelu and swiglu match the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const int64_t n = 67, c = 129;
  Tensor y = test::random_tensor({n, c}, 11), bias = test::random_tensor({c}, 12),
         dy = test::random_tensor({n, c}, 13), db = test::random_tensor({c}, 14),
         x = test::random_tensor({n, c}, 15, 4.0f), up = test::random_tensor({n, c}, 16);
  Tensor gy = y.to(kGpu), gdb = db.to(kGpu), gx = x.to(kGpu), gup = up.to(kGpu), gdy = dy.to(kGpu);
  ops::bias_add(y, bias);
  ops::bias_add(gy, bias.to(kGpu));
  REQUIRE(gy.to_vector() == y.to_vector());
  ops::bias_grad(dy, db);
  ops::bias_grad(gdy, gdb);
  REQUIRE(gdb.to_vector() == db.to_vector());

  auto empty = [&] { return Tensor::empty({n, c}); };
  auto gempty = [&] { return Tensor::empty({n, c}, DType::f32, kGpu); };
  Tensor out = empty(), gout = gempty();
  ops::gelu_forward(x, out);
  ops::gelu_forward(gx, gout);
  CHECK(error(gout, out) <= kTolerance);
  ops::gelu_backward(dy, x, out);
  ops::gelu_backward(gdy, gx, gout);
  CHECK(error(gout, out) <= kTolerance);
  ops::swiglu_forward(x, up, out);
  ops::swiglu_forward(gx, gup, gout);
  CHECK(error(gout, out) <= kTolerance);
  Tensor dgate = empty(), dup = empty(), gdgate = gempty(), gdup = gempty();
  ops::swiglu_backward(dy, x, up, dgate, dup);
  ops::swiglu_backward(gdy, gx, gup, gdgate, gdup);
  CHECK(error(gdgate, dgate) <= kTolerance);
  CHECK(error(gdup, dup) <= kTolerance);
}

TEST_CASE("cuda: rope forward and backward match the CPU, in place too", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const int64_t batch = 3, seq = 17, heads = 4, hd = 16;
  Tensor x = test::random_tensor({batch * seq, heads * hd}, 17);
  for (int64_t offset : {int64_t{0}, int64_t{300}}) {
    Tensor y = Tensor::empty(x.shape()), back = Tensor::empty(x.shape());
    ops::rope_forward(x, batch, seq, heads, 10000.0f, y, offset);
    ops::rope_backward(y, batch, seq, heads, 10000.0f, back, offset);
    Tensor g = x.to(kGpu);
    ops::rope_forward(g, batch, seq, heads, 10000.0f, g, offset);  // in place
    CHECK(error(g, y) <= kTolerance);
    ops::rope_backward(g, batch, seq, heads, 10000.0f, g, offset);
    CHECK(error(g, back) <= kTolerance);
  }
}

TEST_CASE("cuda: attention forward and backward match the CPU, grouped-query heads too", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  // The last with a sliding window of 7 (issue 44): the masked scores are zeros on both.
  const ops::AttentionShape shapes[] = {
      {2, 33, 4, 2, 16}, {3, 20, 3, 3, 8}, {1, 64, 8, 1, 32}, {2, 33, 4, 2, 16, 7}};
  for (const ops::AttentionShape& a : shapes) {
    INFO("B " << a.batch << " T " << a.seq << " H " << a.heads << " KV " << a.kv_heads << " window "
              << a.window);
    const int64_t n = a.batch * a.seq;
    const Shape qs{n, a.heads * a.head_dim}, ks{n, a.kv_heads * a.head_dim},
        ps{a.batch, a.heads, a.seq, a.seq};
    Tensor q = test::random_tensor(qs, 18), k = test::random_tensor(ks, 19),
           v = test::random_tensor(ks, 20), dctx = test::random_tensor(qs, 21);
    Tensor probs = Tensor::empty(ps), ctx = Tensor::empty(qs);
    Tensor gprobs = Tensor::empty(ps, DType::f32, kGpu), gctx = Tensor::empty(qs, DType::f32, kGpu);
    ops::attention_forward(q, k, v, a, probs, ctx);
    ops::attention_forward(q.to(kGpu), k.to(kGpu), v.to(kGpu), a, gprobs, gctx);
    CHECK(error(gprobs, probs) <= kTolerance);
    CHECK(error(gctx, ctx) <= kTolerance);
    // Exact zeros above the diagonal.
    const std::vector<float> p = gprobs.to_vector();
    for (int64_t r = 0; r < a.batch * a.heads * a.seq; ++r) {
      for (int64_t j = r % a.seq + 1; j < a.seq; ++j) REQUIRE(p[r * a.seq + j] == 0.0f);
      for (int64_t j = 0; a.window > 0 && j <= r % a.seq - a.window; ++j)
        REQUIRE(p[r * a.seq + j] == 0.0f);
    }

    Tensor dq = Tensor::empty(qs), dk = Tensor::empty(ks), dv = Tensor::empty(ks);
    Tensor gdq = Tensor::empty(qs, DType::f32, kGpu), gdk = Tensor::empty(ks, DType::f32, kGpu),
           gdv = Tensor::empty(ks, DType::f32, kGpu);
    ops::attention_backward(dctx, q, k, v, probs, a, dq, dk, dv);
    ops::attention_backward(dctx.to(kGpu), q.to(kGpu), k.to(kGpu), v.to(kGpu), probs.to(kGpu), a,
                            gdq, gdk, gdv);
    CHECK(error(gdq, dq) <= kTolerance);
    CHECK(error(gdk, dk) <= kTolerance);
    CHECK(error(gdv, dv) <= kTolerance);
  }
}

TEST_CASE("cuda: cached attention matches the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const int64_t H = 8, KV = 2, hd = 16, slots = 4, capacity = 40;
  ops::CachedRows rows;
  rows.slot = {3, 0, 1};
  rows.start = {0, 17, 39};
  rows.count = {12, 5, 1};
  const int64_t n = rows.tokens();
  const Shape qs{n, H * hd}, cs{slots, capacity, KV * hd};
  Tensor q = test::random_tensor(qs, 22), kc = test::random_tensor(cs, 23),
         vc = test::random_tensor(cs, 24);
  for (int64_t window : {0, 9}) {  // 9: the decode row at 39 reads 31..39
    INFO("window " << window);
    rows.window = window;
    Tensor ctx = Tensor::empty(qs), gctx = Tensor::empty(qs, DType::f32, kGpu);
    ops::attention_forward_cached(q, kc, vc, H, KV, rows, ctx);
    ops::attention_forward_cached(q.to(kGpu), kc.to(kGpu), vc.to(kGpu), H, KV, rows, gctx);
    CHECK(error(gctx, ctx) <= kTolerance);
  }
}

TEST_CASE("cuda: cross-entropy matches the CPU, ignored rows and bad targets too", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const int64_t n = 37, vocab = 1001;
  Tensor logits = test::random_tensor({n, vocab}, 25, 3.0f);
  std::vector<int32_t> target_values(n);
  for (int64_t i = 0; i < n; ++i)
    target_values[i] = i % 5 == 2 ? -1 : static_cast<int32_t>(i * 27 % vocab);
  Tensor targets = Tensor::from_vector({n}, target_values);
  Tensor dlogits = Tensor::empty({n, vocab}), nll = Tensor::empty({n});
  Tensor gdlogits = Tensor::empty({n, vocab}, DType::f32, kGpu),
         gnll = Tensor::empty({n}, DType::f32, kGpu);
  Tensor glogits = logits.to(kGpu), gtargets = targets.to(kGpu);
  const double loss = ops::cross_entropy(logits, targets, 0.5f, &dlogits, &nll);
  const double gloss = ops::cross_entropy(glogits, gtargets, 0.5f, &gdlogits, &gnll);
  CHECK(gloss == Approx(loss).epsilon(1e-5));
  CHECK(error(gdlogits, dlogits) <= kTolerance);
  CHECK(error(gnll, nll) <= kTolerance);
  // Without outputs, the loss alone.
  CHECK(ops::cross_entropy(glogits, gtargets, 1.0f, nullptr, nullptr) ==
        Approx(loss).epsilon(1e-5));
  target_values[3] = static_cast<int32_t>(vocab);
  Tensor bad = Tensor::from_vector({n}, target_values).to(kGpu);
  REQUIRE_THROWS_WITH(ops::cross_entropy(glogits, bad, 1.0f, nullptr, nullptr),
                      Catch::Contains("target 1001 at row 3"));
}
