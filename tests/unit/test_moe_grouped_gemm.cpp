// Grouped expert GEMM ops against naive loops (both weight layouts, beta, empty segments, K cut
// into a multiple-of-64 prefix and a rest), and their independence of the thread count for K
// beyond OpenBLAS's K-block. Shapes: M rows in segments, E experts, W [E,R,S].
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "moe/ops/moe.h"
#include "moe/threads.h"
#include "support/gradcheck.h"

using namespace moe;

namespace {

// max |a - b| / max |b|
double rel_error(const std::vector<double>& ref, const Tensor& got) {
  const float* g = got.data<float>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::fabs(g[i] - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return diff / scale;
}

void set_threads(int n) {
  omp_set_num_threads(n);
  moe::set_num_threads(n);
}

}  // namespace

TEST_CASE("moe: grouped_gemm and its weight gradient match naive loops", "[moe]") {
  const std::vector<int32_t> offsets{0, 70, 70, 201, 203};  // an empty and a 2-row segment
  const int64_t E = 4, M = 203;
  for (int64_t K : {40, 64, 100}) {  // K below, at and past a multiple of 64
    for (bool transpose_w : {true, false}) {
      INFO("K " << K << " transpose_w " << transpose_w);
      const int64_t N = 24;
      Tensor a = test::random_tensor({M, K}, 1);
      Tensor w = test::random_tensor(transpose_w ? Shape{E, N, K} : Shape{E, K, N}, 2);
      Tensor c = test::random_tensor({M, N}, 3);
      std::vector<double> ref(M * N);
      const float *as = a.data<float>(), *ws = w.data<float>(), *c0 = c.data<float>();
      for (int64_t e = 0; e < E; ++e)
        for (int64_t i = offsets[e]; i < offsets[e + 1]; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double sum = 0.5 * c0[i * N + j];
            for (int64_t p = 0; p < K; ++p)
              sum += as[i * K + p] * static_cast<double>(transpose_w ? ws[(e * N + j) * K + p]
                                                                     : ws[(e * K + p) * N + j]);
            ref[i * N + j] = sum;
          }
      ops::grouped_gemm(a, w, transpose_w, offsets, c, 0.5f);
      REQUIRE(rel_error(ref, c) < 1e-5);
    }
  }
  // dW[e] += dY_seg^T X_seg with segments of 70 (64 + 6) and 131 (128 + 3) rows.
  const int64_t R = 12, S = 9;
  Tensor dy = test::random_tensor({M, R}, 4), x = test::random_tensor({M, S}, 5);
  Tensor dw = test::random_tensor({E, R, S}, 6);
  std::vector<double> ref(E * R * S);
  const float *dys = dy.data<float>(), *xs = x.data<float>(), *dw0 = dw.data<float>();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < S; ++j) {
        double sum = dw0[(e * R + i) * S + j];
        for (int64_t t = offsets[e]; t < offsets[e + 1]; ++t)
          sum += static_cast<double>(dys[t * R + i]) * xs[t * S + j];
        ref[(e * R + i) * S + j] = sum;
      }
  ops::grouped_gemm_weight_grad(dy, x, offsets, dw);
  REQUIRE(rel_error(ref, dw) < 1e-5);
  REQUIRE_THROWS_WITH(ops::grouped_gemm(x, dw, true, {0, 100, 203}, dy),
                      Catch::Contains("offsets"));
}

TEST_CASE("moe: grouped GEMMs with long K give the same bits with 1 and 2 threads", "[moe]") {
  // K = 1000 rows per segment (weight gradient) and K = 1000 columns (forward): longer than
  // OpenBLAS's K-block and not a multiple of 64, where a single sgemm rounds differently per
  // thread count.
  const std::vector<int32_t> offsets{0, 1000, 1990};
  Tensor dy = test::random_tensor({1990, 64}, 7), x = test::random_tensor({1990, 32}, 8);
  Tensor a = test::random_tensor({1990, 1000}, 9), w = test::random_tensor({2, 48, 1000}, 10);
  auto run = [&](int threads) {
    set_threads(threads);
    Tensor dw = Tensor::zeros({2, 64, 32});
    ops::grouped_gemm_weight_grad(dy, x, offsets, dw);
    Tensor c = Tensor::empty({1990, 48});
    ops::grouped_gemm(a, w, true, offsets, c);
    return std::make_pair(dw.to_vector(), c.to_vector());
  };
  auto one = run(1);
  auto two = run(2);
  set_threads(2);
  REQUIRE(std::memcmp(one.first.data(), two.first.data(), one.first.size() * 4) == 0);
  REQUIRE(std::memcmp(one.second.data(), two.second.data(), one.second.size() * 4) == 0);
}
