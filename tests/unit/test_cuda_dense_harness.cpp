// The CUDA dense-op kernels' index mapping, run on the CPU over odd grids (run_grid_on_cpu) and
// compared bitwise with the CPU backend. Attention runs
// the CUDA op's step sequence (attention.cuh) with CPU GEMMs in place of cuBLAS, so its offsets and
// strides are checked too. The same bodies run on the GPU (backend/cuda/*.cu).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cuda/activation.cuh"
#include "backend/cuda/attention.cuh"
#include "backend/cuda/cross_entropy.cuh"
#include "backend/cuda/embedding.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/embedding_order.h"
#include "moe/ops/dense.h"
#include "support/cuda.h"
#include "support/gemm_kernel.h"
#include "support/gradcheck.h"

using namespace moe;
namespace body = moe::cuda::body;

namespace {

std::vector<float> values(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  return test::random_tensor(shape, seed, scale).to_vector();
}

int64_t count_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor tensor(const Shape& shape, const std::vector<float>& v) {
  return Tensor::from_vector(shape, v);
}

// Elementwise |a - b| <= rel * max(1, |b|); NaN (an unwritten slot) fails.
void require_near(const std::vector<float>& a, const std::vector<float>& b, double rel) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("index " << i << ": " << a[i] << " vs " << b[i]);
    REQUIRE(std::fabs(static_cast<double>(a[i]) - b[i]) <=
            rel * std::max(1.0, std::fabs(static_cast<double>(b[i]))));
  }
}

// cuBLAS's strided-batched product, as serial CPU GEMMs.
void cpu_batched(const cuda::BatchedGemm& g) {
  for (int64_t i = 0; i < g.batch; ++i)
    cpu::sgemm(g.transpose_a, g.transpose_b, g.m, g.n, g.k, g.alpha, g.a + i * g.stride_a, g.lda,
               g.b + i * g.stride_b, g.ldb, g.beta, g.c + i * g.stride_c, g.ldc);
}

// Random attention operands of shape `a` (seeds from `seed` on), the CPU op's forward and
// backward on them, and the CUDA backward step sequence (CPU GEMMs) on the op's probabilities:
// what the attention harness tests compare.
struct AttentionCase {
  ops::AttentionShape a;
  Shape qs, ks, ps;
  std::vector<float> q, k, v, dctx;
  Tensor probs, ctx, dq, dk, dv;

  AttentionCase(const ops::AttentionShape& shape, uint64_t seed)
      : a(shape),
        qs{a.batch * a.seq, a.heads * a.head_dim},
        ks{a.batch * a.seq, a.kv_heads * a.head_dim},
        ps{a.batch, a.heads, a.seq, a.seq},
        q(values(qs, seed)),
        k(values(ks, seed + 1)),
        v(values(ks, seed + 2)),
        dctx(values(qs, seed + 3)),
        probs(Tensor::empty(ps)),
        ctx(Tensor::empty(qs)),
        dq(Tensor::empty(qs)),
        dk(Tensor::empty(ks)),
        dv(Tensor::empty(ks)) {
    ops::attention_forward(tensor(qs, q), tensor(ks, k), tensor(ks, v), a, probs, ctx);
    ops::attention_backward(tensor(qs, dctx), tensor(qs, q), tensor(ks, k), tensor(ks, v), probs, a,
                            dq, dk, dv);
  }

  float scale() const { return 1.0f / std::sqrt(static_cast<float>(a.head_dim)); }

  // The CUDA backward's outputs, from the op's own probabilities; its row kernels on `grid`.
  struct Grads {
    std::vector<float> dscores, dq, dk, dv;
  };
  Grads cuda_backward(cuda::LaunchShape grid) const {
    Grads g{std::vector<float>(count_of(ps), -7.0f), std::vector<float>(count_of(qs), -7.0f),
            std::vector<float>(count_of(ks), -7.0f), std::vector<float>(count_of(ks), -7.0f)};
    const std::vector<float> p = probs.to_vector();
    auto softmax_backward = [grid](const float* pr, float* ds, int64_t rows, int64_t seq,
                                   float sc) {
      cuda::run_grid_on_cpu<body::CausalSoftmaxBackwardRows>(grid, pr, ds, rows, seq, sc);
    };
    cuda::attention_backward_steps(dctx.data(), q.data(), k.data(), v.data(), p.data(),
                                   g.dscores.data(), g.dq.data(), g.dk.data(), g.dv.data(), a.batch,
                                   a.seq, a.heads, a.kv_heads, a.head_dim, scale(), cpu_batched,
                                   softmax_backward);
    return g;
  }
};

}  // namespace

TEST_CASE("cuda harness: embedding gather and grouped scatter-add match the CPU",
          "[cuda-harness]") {
  const int64_t rows = 11, dim = 13, n = 37;
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i)
    ids[i] = static_cast<int32_t>((i * 5 + i / 3) % 9);  // 0..8, 3 to 5 times each
  ids[4] = 10;                                           // an id used once; 9 unused
  const std::vector<float> table = values({rows, dim}, 1), dy = values({n, dim}, 2),
                           grad0 = values({rows, dim}, 3);
  Tensor ids_t = Tensor::from_vector({n}, ids);
  Tensor out_ref = Tensor::empty({n, dim});
  ops::embedding_forward(tensor({rows, dim}, table), ids_t, out_ref);
  Tensor grad_ref = tensor({rows, dim}, grad0);
  ops::embedding_backward(tensor({n, dim}, dy), ids_t, grad_ref);

  const backend::EmbeddingOrder g = backend::embedding_order(ids.data(), n, rows);
  const int64_t count = static_cast<int64_t>(g.touched.size());
  REQUIRE(count == 10);
  REQUIRE(g.offsets[count] == n);
  for (auto shape : test::kHarnessGrids) {
    std::vector<float> out(n * dim, -1.0f);
    cuda::run_grid_on_cpu<body::EmbeddingGather>(
        shape, table.data(), static_cast<const int32_t*>(ids.data()), out.data(), n, dim);
    REQUIRE(out == out_ref.to_vector());
    std::vector<float> grad = grad0;
    cuda::run_grid_on_cpu<body::EmbeddingScatterAdd>(
        shape, dy.data(), static_cast<const int64_t*>(g.order.data()),
        static_cast<const int64_t*>(g.touched.data()),
        static_cast<const int64_t*>(g.offsets.data()), grad.data(), count, dim);
    REQUIRE(grad == grad_ref.to_vector());
  }
  // No tokens: nothing touched.
  REQUIRE(backend::embedding_order(ids.data(), 0, rows).touched.empty());
}

TEST_CASE("cuda harness: layernorm and rmsnorm rows and parameter gradients match the CPU",
          "[cuda-harness]") {
  const int64_t n = 19, d = 77;  // d past one 64-column block of the CPU op
  const std::vector<float> x = values({n, d}, 4, 3.0f), w = values({d}, 5), b = values({d}, 6),
                           dy = values({n, d}, 7), dw0 = values({d}, 8), db0 = values({d}, 9);
  const float eps = 1e-5f;
  Tensor y_ref = Tensor::empty({n, d}), mean_ref = Tensor::empty({n}),
         rstd_ref = Tensor::empty({n});
  ops::layernorm_forward(tensor({n, d}, x), tensor({d}, w), tensor({d}, b), eps, y_ref, &mean_ref,
                         &rstd_ref);
  Tensor dx_ref = Tensor::empty({n, d}), dw_ref = tensor({d}, dw0), db_ref = tensor({d}, db0);
  ops::layernorm_backward(tensor({n, d}, dy), tensor({n, d}, x), tensor({d}, w), mean_ref, rstd_ref,
                          dx_ref, dw_ref, &db_ref);
  Tensor ry_ref = Tensor::empty({n, d}), rrstd_ref = Tensor::empty({n});
  ops::rmsnorm_forward(tensor({n, d}, x), tensor({d}, w), eps, ry_ref, &rrstd_ref);
  Tensor rdx_ref = Tensor::empty({n, d}), rdw_ref = tensor({d}, dw0);
  ops::rmsnorm_backward(tensor({n, d}, dy), tensor({n, d}, x), tensor({d}, w), rrstd_ref, rdx_ref,
                        rdw_ref);
  const std::vector<float> mean = mean_ref.to_vector(), rstd = rstd_ref.to_vector(),
                           rrstd = rrstd_ref.to_vector();

  for (auto shape : test::kHarnessGrids) {
    std::vector<float> y(n * d), m(n), r(n);
    cuda::run_grid_on_cpu<body::LayerNormRows>(shape, x.data(), w.data(), b.data(), y.data(),
                                               m.data(), r.data(), n, d, eps);
    REQUIRE(y == y_ref.to_vector());
    REQUIRE(m == mean);
    REQUIRE(r == rstd);
    std::vector<float> y2(n * d);  // without mean / rstd outputs
    float* none = nullptr;
    cuda::run_grid_on_cpu<body::LayerNormRows>(shape, x.data(), w.data(), b.data(), y2.data(), none,
                                               none, n, d, eps);
    REQUIRE(y2 == y);

    std::vector<float> dx(n * d), dw = dw0, db = db0;
    cuda::run_grid_on_cpu<body::LayerNormRowsBackward>(shape, dy.data(), x.data(), w.data(),
                                                       mean.data(), rstd.data(), dx.data(), n, d);
    cuda::run_grid_on_cpu<body::NormParamGrad>(shape, dy.data(), x.data(), mean.data(), rstd.data(),
                                               dw.data(), db.data(), n, d);
    REQUIRE(dx == dx_ref.to_vector());
    REQUIRE(dw == dw_ref.to_vector());
    REQUIRE(db == db_ref.to_vector());

    std::vector<float> ry(n * d), rr(n);
    cuda::run_grid_on_cpu<body::RmsNormRows>(shape, x.data(), w.data(), ry.data(), rr.data(), n, d,
                                             eps);
    REQUIRE(ry == ry_ref.to_vector());
    REQUIRE(rr == rrstd);
    std::vector<float> rdx(n * d), rdw = dw0;
    const float* no_mean = nullptr;
    cuda::run_grid_on_cpu<body::RmsNormRowsBackward>(shape, dy.data(), x.data(), w.data(),
                                                     rrstd.data(), rdx.data(), n, d);
    cuda::run_grid_on_cpu<body::NormParamGrad>(shape, dy.data(), x.data(), no_mean, rrstd.data(),
                                               rdw.data(), none, n, d);
    REQUIRE(rdx == rdx_ref.to_vector());
    REQUIRE(rdw == rdw_ref.to_vector());
  }
}

TEST_CASE("cuda harness: bias and activations match the CPU", "[cuda-harness]") {
  const int64_t n = 23, c = 71;
  const Shape s{n, c};
  const std::vector<float> y0 = values(s, 10), bias = values({c}, 11), dy = values(s, 12),
                           db0 = values({c}, 13), x = values(s, 14, 4.0f), up = values(s, 15);
  Tensor y_ref = tensor(s, y0);
  ops::bias_add(y_ref, tensor({c}, bias));
  Tensor db_ref = tensor({c}, db0);
  ops::bias_grad(tensor(s, dy), db_ref);
  Tensor gelu_ref = Tensor::empty(s), dgelu_ref = Tensor::empty(s), swiglu_ref = Tensor::empty(s),
         dgate_ref = Tensor::empty(s), dup_ref = Tensor::empty(s);
  ops::gelu_forward(tensor(s, x), gelu_ref);
  ops::gelu_backward(tensor(s, dy), tensor(s, x), dgelu_ref);
  ops::swiglu_forward(tensor(s, x), tensor(s, up), swiglu_ref);
  ops::swiglu_backward(tensor(s, dy), tensor(s, x), tensor(s, up), dgate_ref, dup_ref);

  const int64_t total = n * c;
  for (auto shape : test::kHarnessGrids) {
    std::vector<float> y = y0, db = db0;
    cuda::run_grid_on_cpu<body::BiasAdd>(shape, y.data(), bias.data(), n, c);
    REQUIRE(y == y_ref.to_vector());
    cuda::run_grid_on_cpu<body::BiasGrad>(shape, dy.data(), db.data(), n, c);
    REQUIRE(db == db_ref.to_vector());

    // GELU's tanh and SiLU's exp are kernels::tanh_f / exp_f on both sides (no libm call):
    // bitwise, whichever vector copy the CPU op runs.
    std::vector<float> out(total, std::nanf(""));
    cuda::run_grid_on_cpu<body::Gelu>(shape, x.data(), out.data(), total);
    REQUIRE(out == gelu_ref.to_vector());
    std::fill(out.begin(), out.end(), std::nanf(""));
    cuda::run_grid_on_cpu<body::GeluBackward>(shape, dy.data(), x.data(), out.data(), total);
    REQUIRE(out == dgelu_ref.to_vector());
    cuda::run_grid_on_cpu<body::Swiglu>(shape, x.data(), up.data(), out.data(), total);
    REQUIRE(out == swiglu_ref.to_vector());
    // Outputs aliasing inputs: dgate over gate, dup over up.
    std::vector<float> gate_buf = x, up_buf = up;
    cuda::run_grid_on_cpu<body::SwigluBackward>(shape, dy.data(), gate_buf.data(), up_buf.data(),
                                                gate_buf.data(), up_buf.data(), total);
    REQUIRE(gate_buf == dgate_ref.to_vector());
    REQUIRE(up_buf == dup_ref.to_vector());
  }
}

TEST_CASE("cuda harness: rope table and rotation match the CPU, in place too", "[cuda-harness]") {
  const int64_t batch = 3, seq = 5, heads = 3, hd = 10, half = hd / 2, offset = 7;
  const float theta = 10000.0f;
  const Shape s{batch * seq, heads * hd};
  const std::vector<float> x = values(s, 16);
  for (bool inverse : {false, true}) {
    Tensor ref = Tensor::empty(s);
    if (inverse)
      ops::rope_backward(tensor(s, x), batch, seq, heads, theta, ref, offset);
    else
      ops::rope_forward(tensor(s, x), batch, seq, heads, theta, ref, offset);
    for (auto shape : test::kHarnessGrids) {
      std::vector<float> cos_table(seq * half, -2.0f), sin_table(seq * half, -2.0f);
      cuda::run_grid_on_cpu<body::RopeTable>(shape, cos_table.data(), sin_table.data(), seq, half,
                                             hd, theta, offset);
      std::vector<float> y(x.size()), in_place = x;
      cuda::run_grid_on_cpu<body::RopeRotate>(
          shape, x.data(), y.data(), static_cast<const float*>(cos_table.data()),
          static_cast<const float*>(sin_table.data()), batch * seq, seq, heads, hd, hd, inverse);
      REQUIRE(y == ref.to_vector());
      cuda::run_grid_on_cpu<body::RopeRotate>(
          shape, static_cast<const float*>(in_place.data()), in_place.data(),
          static_cast<const float*>(cos_table.data()), static_cast<const float*>(sin_table.data()),
          batch * seq, seq, heads, hd, hd, inverse);
      REQUIRE(in_place == y);
    }
  }
}

TEST_CASE("cuda harness: attention steps with CPU GEMMs match the CPU op, GQA included",
          "[cuda-harness]") {
  // The last two with a sliding window (of 3 keys; of 1, each query seeing only itself).
  const ops::AttentionShape shapes[] = {
      {2, 7, 4, 2, 5}, {1, 9, 3, 3, 4}, {3, 5, 4, 1, 6}, {2, 9, 4, 2, 5, 3}, {1, 6, 2, 1, 4, 1}};
  for (const ops::AttentionShape& a : shapes) {
    const AttentionCase c(a, 20);
    for (auto shape : test::kHarnessGrids) {
      INFO("B " << a.batch << " T " << a.seq << " H " << a.heads << " KV " << a.kv_heads
                << " window " << a.window << " grid " << shape.blocks << "x" << shape.threads);
      std::vector<float> probs(count_of(c.ps), -7.0f), ctx(count_of(c.qs), -7.0f);
      auto softmax = [shape](float* scores, int64_t rows, int64_t queries, int64_t keys,
                             int64_t start, int64_t window) {
        cuda::run_grid_on_cpu<body::CausalSoftmaxRows>(shape, scores, rows, queries, keys, start,
                                                       window);
      };
      cuda::attention_forward_steps(c.q.data(), c.k.data(), c.v.data(), probs.data(), ctx.data(),
                                    a.batch, a.seq, a.heads, a.kv_heads, a.head_dim, c.scale(),
                                    a.window, cpu_batched, softmax);
      // The softmax rows are kernels::causal_softmax_row on both sides (exp_f, one order of
      // sums), whichever vector copy the CPU op runs, and the products the same tiled sgemm: the
      // forward gives the op's bits, and the backward, run on the op's probabilities, too.
      REQUIRE(probs == c.probs.to_vector());
      REQUIRE(ctx == c.ctx.to_vector());
      const AttentionCase::Grads g = c.cuda_backward(shape);
      REQUIRE(g.dq == c.dq.to_vector());
      REQUIRE(g.dk == c.dk.to_vector());
      REQUIRE(g.dv == c.dv.to_vector());
    }
  }
}

TEST_CASE("cuda harness: long causal attention cut into row blocks gives the full products'",
          "[cuda-harness]") {
  // The CPU op cuts each head's products into blocks of query rows that skip what lies above the
  // diagonal (backend/cpu/attention.cpp); the CUDA step sequence with CPU GEMMs computes the whole
  // T x T products. With the AVX-512 tile kernel an element is one FMA chain over K while K fits
  // one k block: at T 100 (4 blocks of 32 rows) the backward, run on the same probabilities, is
  // the whole products' bits (the skipped terms are exactly 0 x finite). At T 300 (8 blocks of
  // 38) the k blocks of the long sums move: the two are different fp32 orders of the same terms,
  // each within (K + 2) u of the exact sum of their magnitudes, so within twice that of each
  // other (a head group's dk and dv add `group` more roundings). Shapes with head_dim 16, so that
  // every tile is the AVX-512 kernel's (narrower ones go to CBLAS, which sums its own way).
  if (!cpu::gemm_kernel_supported(cpu::GemmKernel::avx512)) {
    // Asking for the kernel is refused (the T 100 naive-loop and T 40 finite-difference tests of
    // test_dense_ops.cpp check the blocks on every host).
    CHECK_THROWS_AS(cpu::set_gemm_kernel(cpu::GemmKernel::avx512), UsageError);
    WARN("no AVX-512 here: the row blocks' bits are checked where the AVX-512 tile kernel runs");
    return;
  }
  test::GemmKernelGuard guard;
  cpu::set_gemm_kernel(cpu::GemmKernel::avx512);
  const double u = FLT_EPSILON / 2;
  for (const ops::AttentionShape& a :
       {ops::AttentionShape{2, 100, 4, 2, 16}, ops::AttentionShape{1, 300, 2, 1, 16}}) {
    INFO("B " << a.batch << " T " << a.seq << " H " << a.heads << " KV " << a.kv_heads);
    const int64_t T = a.seq, hd = a.head_dim, group = a.heads / a.kv_heads;
    const AttentionCase c(a, 40);
    const AttentionCase::Grads g = c.cuda_backward(test::kHarnessGrids[0]);
    if (T <= 256) {
      REQUIRE(g.dq == c.dq.to_vector());
      REQUIRE(g.dk == c.dk.to_vector());
      REQUIRE(g.dv == c.dv.to_vector());
      continue;
    }
    // The sums' magnitudes: dq = dS K over keys, dk = dS^T Q and dv = P^T dctx over queries and
    // the group's heads.
    const int64_t ldq = a.heads * hd, ldk = a.kv_heads * hd;
    std::vector<double> mq(count_of(c.qs), 0.0), mk(count_of(c.ks), 0.0), mv(count_of(c.ks), 0.0);
    const std::vector<float> probs = c.probs.to_vector();
    for (int64_t b = 0; b < a.batch; ++b)
      for (int64_t h = 0; h < a.heads; ++h)
        for (int64_t i = 0; i < T; ++i)
          for (int64_t j = 0; j <= i; ++j) {
            const size_t at = static_cast<size_t>(((b * a.heads + h) * T + i) * T + j);
            const double ds = std::fabs(g.dscores[at]), p = probs[at];
            for (int64_t e = 0; e < hd; ++e) {
              const int64_t qi = (b * T + i) * ldq + h * hd + e;
              const int64_t kj = (b * T + j) * ldk + (h / group) * hd + e;
              mq[qi] += ds * std::fabs(c.k[kj]);
              mk[kj] += ds * std::fabs(c.q[qi]);
              mv[kj] += p * std::fabs(c.dctx[qi]);
            }
          }
    auto within = [&](const std::vector<float>& got, const Tensor& ref,
                      const std::vector<double>& magnitude, double terms) {
      const std::vector<float> want = ref.to_vector();
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("index " << i << ": " << got[i] << " vs " << want[i]);
        REQUIRE(std::fabs(double(got[i]) - want[i]) <= 2 * (terms + 2) * u * magnitude[i]);
      }
    };
    within(g.dq, c.dq, mq, double(T));
    within(g.dk, c.dk, mk, double(T + group));
    within(g.dv, c.dv, mv, double(T + group));
  }
}

TEST_CASE("cuda harness: cached attention steps with CPU GEMMs match the CPU op",
          "[cuda-harness]") {
  const int64_t H = 4, KV = 2, hd = 6, slots = 3, capacity = 10;
  ops::CachedRows rows;
  rows.slot = {2, 0, 1};
  rows.start = {0, 4, 9};
  rows.count = {3, 2, 1};
  const int64_t n = rows.tokens();
  const Shape qs{n, H * hd}, cs{slots, capacity, KV * hd};
  const std::vector<float> q = values(qs, 24), kc = values(cs, 25), vc = values(cs, 26);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // window 4: the decode row at 9 sees 6..9, the others' later queries lose their first keys too
  for (int64_t window : {0, 4}) {
    rows.window = window;
    INFO("window " << window);
    Tensor ctx_ref = Tensor::empty(qs);
    ops::attention_forward_cached(tensor(qs, q), tensor(cs, kc), tensor(cs, vc), H, KV, rows,
                                  ctx_ref);
    for (auto shape : test::kHarnessGrids) {
      std::vector<float> ctx(count_of(qs), -7.0f), scores(H * 6 * 6, -7.0f);
      auto softmax = [shape](float* s, int64_t r, int64_t queries, int64_t keys, int64_t start,
                             int64_t window) {
        cuda::run_grid_on_cpu<body::CausalSoftmaxRows>(shape, s, r, queries, keys, start, window);
      };
      cuda::attention_cached_steps(q.data(), kc.data(), vc.data(), ctx.data(), scores.data(),
                                   rows.slot.data(), rows.start.data(), rows.count.data(),
                                   rows.rows(), H, KV, hd, capacity, scale, rows.window,
                                   cpu_batched, softmax);
      // The same softmax body on both sides, but the CPU op takes a decode row's (one new token
      // after cached ones) two products by plain loops (decode_head), in another order than the
      // sgemm here: within 1e-6 (values of order 1, sums of up to 10 products of 6 terms).
      require_near(ctx, ctx_ref.to_vector(), 1e-6);
    }
  }
}

TEST_CASE("cuda harness: cross-entropy rows match the CPU, ignored rows and no gradient too",
          "[cuda-harness]") {
  const int64_t n = 9, vocab = 33;
  std::vector<float> logits = values({n, vocab}, 27, 3.0f);
  logits[40] = 70.0f;  // a large logit
  const std::vector<int32_t> targets{3, -1, 32, 0, 7, -1, 1, 1, 20};
  Tensor logits_t = tensor({n, vocab}, logits), targets_t = Tensor::from_vector({n}, targets);
  Tensor dlogits_ref = Tensor::empty({n, vocab}), nll_ref = Tensor::empty({n});
  const float scale = 0.75f;
  const double loss_ref = ops::cross_entropy(logits_t, targets_t, scale, &dlogits_ref, &nll_ref);
  const float grad_scale = scale / 7.0f;  // 7 counted rows, as the CUDA op computes it
  for (auto shape : test::kHarnessGrids) {
    std::vector<float> dlogits(n * vocab, -7.0f), nll(n, -7.0f);
    cuda::run_grid_on_cpu<body::CrossEntropyRows>(shape, static_cast<const float*>(logits.data()),
                                                  targets.data(), dlogits.data(), nll.data(), n,
                                                  vocab, grad_scale);
    REQUIRE(dlogits == dlogits_ref.to_vector());
    REQUIRE(nll == nll_ref.to_vector());
    double sum = 0;  // the CUDA op's host-side mean
    for (int64_t i = 0; i < n; ++i)
      if (targets[i] >= 0) sum += nll[i];
    REQUIRE(sum / 7.0 == loss_ref);
    std::vector<float> nll_only(n, -7.0f);
    float* no_grad = nullptr;
    cuda::run_grid_on_cpu<body::CrossEntropyRows>(shape, static_cast<const float*>(logits.data()),
                                                  targets.data(), no_grad, nll_only.data(), n,
                                                  vocab, grad_scale);
    REQUIRE(nll_only == nll);
  }
}
