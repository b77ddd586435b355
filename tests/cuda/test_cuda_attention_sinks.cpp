// [cuda] attention sinks (gpt-oss, issue 44) on a GPU against the CPU backend: the forward's
// probabilities and context, the backward's dq, dk, dv and the sinks' gradient, and the cached
// forward, with windows and GQA and sinks far below, near and far above the scores. Within the
// fp32 tolerance of tests/cuda/test_cuda_dense.cpp (1e-5 normalised: cuBLAS sums the products in
// its own order; the row bodies are the CPU's). The bodies' index mapping is checked bitwise on
// the CPU harness (tests/unit/test_attention_sinks.cpp).
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

TEST_CASE("cuda: attention with sinks matches the CPU, forward and backward", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const std::vector<float> values{-30.0f, 0.0f, 1.5f, 0.5f, -1.0f, 2.0f, 0.25f, 40.0f};
  const Tensor sinks = Tensor::from_vector({8}, values);
  for (const ops::AttentionShape& a :
       {ops::AttentionShape{2, 33, 8, 2, 16, 0}, ops::AttentionShape{2, 33, 8, 4, 16, 7}}) {
    INFO("T " << a.seq << " KV " << a.kv_heads << " window " << a.window);
    const int64_t n = a.batch * a.seq;
    const Shape qs{n, a.heads * a.head_dim}, ks{n, a.kv_heads * a.head_dim},
        ps{a.batch, a.heads, a.seq, a.seq};
    Tensor q = test::random_tensor(qs, 31), k = test::random_tensor(ks, 32),
           v = test::random_tensor(ks, 33), dctx = test::random_tensor(qs, 34);
    Tensor probs = Tensor::empty(ps), ctx = Tensor::empty(qs);
    Tensor gprobs = Tensor::empty(ps, DType::f32, kGpu), gctx = Tensor::empty(qs, DType::f32, kGpu);
    ops::attention_forward(q, k, v, a, probs, ctx, sinks);
    ops::attention_forward(q.to(kGpu), k.to(kGpu), v.to(kGpu), a, gprobs, gctx, sinks.to(kGpu));
    CHECK(error(gprobs, probs) <= kTolerance);
    CHECK(error(gctx, ctx) <= kTolerance);

    Tensor dq = Tensor::empty(qs), dk = Tensor::empty(ks), dv = Tensor::empty(ks),
           dsinks = Tensor::zeros({8});
    Tensor gdq = Tensor::empty(qs, DType::f32, kGpu), gdk = Tensor::empty(ks, DType::f32, kGpu),
           gdv = Tensor::empty(ks, DType::f32, kGpu),
           gdsinks = Tensor::zeros({8}, DType::f32, kGpu);
    ops::attention_backward(dctx, q, k, v, probs, a, dq, dk, dv, sinks, &dsinks);
    ops::attention_backward(dctx.to(kGpu), q.to(kGpu), k.to(kGpu), v.to(kGpu), probs.to(kGpu), a,
                            gdq, gdk, gdv, sinks.to(kGpu), &gdsinks);
    CHECK(error(gdq, dq) <= kTolerance);
    CHECK(error(gdk, dk) <= kTolerance);
    CHECK(error(gdv, dv) <= kTolerance);
    // From the same probabilities and cuBLAS's dctx V^T: the sums over T*B rows of terms whose
    // g differs from the CPU's in the last bits.
    CHECK(error(gdsinks, dsinks) <= kTolerance);
  }
}

TEST_CASE("cuda: cached attention with sinks matches the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const int64_t H = 8, KV = 2, hd = 16, slots = 4, capacity = 40;
  const Tensor sinks = Tensor::from_vector(
      {8}, std::vector<float>{-30.0f, 0.0f, 1.5f, 0.5f, -1.0f, 2.0f, 0.25f, 40.0f});
  ops::CachedRows rows;
  rows.slot = {3, 0, 1};
  rows.start = {0, 17, 39};
  rows.count = {12, 5, 1};
  const int64_t n = rows.tokens();
  const Shape qs{n, H * hd}, cs{slots, capacity, KV * hd};
  Tensor q = test::random_tensor(qs, 35), kc = test::random_tensor(cs, 36),
         vc = test::random_tensor(cs, 37);
  for (int64_t window : {0, 9}) {
    INFO("window " << window);
    rows.window = window;
    Tensor ctx = Tensor::empty(qs), gctx = Tensor::empty(qs, DType::f32, kGpu);
    ops::attention_forward_cached(q, kc, vc, H, KV, rows, ctx, sinks);
    ops::attention_forward_cached(q.to(kGpu), kc.to(kGpu), vc.to(kGpu), H, KV, rows, gctx,
                                  sinks.to(kGpu));
    CHECK(error(gctx, ctx) <= kTolerance);
  }
}
