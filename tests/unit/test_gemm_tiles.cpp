// cpu::sgemm cuts every product into tiles of C fixed by the shape and runs each tile as one
// single-threaded BLAS call: results match an fp64 loop, the tile grid covers C exactly, and the
// bits do not depend on the thread count, on being called from inside a parallel loop, or on
// being batched with other products. Shapes: C [M,N] = op(A) [M,K] op(B) [K,N].
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/gemm.h"
#include "moe/threads.h"
#include "support/bits.h"
#include "support/gradcheck.h"

using namespace moe;

namespace {

struct Operands {
  int64_t m, n, k, lda, ldb, ldc;  // leading dimensions wider than needed: views into larger rows
  bool ta, tb;
  Tensor a, b, c;
};

Operands make_operands(int64_t m, int64_t n, int64_t k, bool ta, bool tb, uint64_t seed) {
  Operands o{m, n, k, (ta ? m : k) + 3, (tb ? k : n) + 5, n + 7, ta, tb, {}, {}, {}};
  o.a = test::random_tensor({ta ? k : m, o.lda}, seed);
  o.b = test::random_tensor({tb ? n : k, o.ldb}, seed + 1);
  o.c = test::random_tensor({m, o.ldc}, seed + 2);
  return o;
}

Tensor run(const Operands& o, float alpha, float beta) {
  Tensor c = o.c.clone();
  cpu::sgemm(o.ta, o.tb, o.m, o.n, o.k, alpha, o.a.data<float>(), o.lda, o.b.data<float>(), o.ldb,
             beta, c.data<float>(), o.ldc);
  return c;
}

}  // namespace

TEST_CASE("gemm tiles: the grid covers C and depends only on the shape", "[core]") {
  // Small products are one call.
  cpu::GemmTiling small = cpu::gemm_tiling(64, 64, 64);
  CHECK(small.tiles_m * small.tiles_n == 1);
  CHECK(small.tile_m == 64);
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{4096, 2048, 512},
                         {300, 270, 70},
                         {256, 128, 2048},
                         {1, 70000, 128},
                         {8, 128, 8192},
                         {1990, 48, 1000}}) {
    INFO(m << " x " << n << " x " << k);
    const cpu::GemmTiling t = cpu::gemm_tiling(m, n, k);
    CHECK(t.tiles_m == (m + t.tile_m - 1) / t.tile_m);
    CHECK(t.tiles_n == (n + t.tile_n - 1) / t.tile_n);
    CHECK(t.tile_m >= 1);
    CHECK(t.tile_n >= 1);
    CHECK(t.tile_m <= std::max<int64_t>(m, 256));
    CHECK(t.tile_n <= std::max<int64_t>(n, 256));
    // Big products are cut so that 2-4 threads have work.
    CHECK(t.tiles_m * t.tiles_n >= 2);
  }
  const cpu::GemmTiling big = cpu::gemm_tiling(4096, 2048, 512);
  CHECK(big.tile_m == 256);
  CHECK(big.tile_n == 256);
}

TEST_CASE("gemm tiles: tiled products match an fp64 loop for all transposes", "[core]") {
  // 300 x 270 x 70 is cut into ragged tiles; alpha, beta and wide leading dimensions are honoured
  // and the padding columns of C are left alone.
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      INFO("transpose a " << ta << " b " << tb);
      Operands o = make_operands(300, 270, 70, ta, tb, 10 + 2 * ta + tb);
      REQUIRE(cpu::gemm_tiling(o.m, o.n, o.k).tiles_m * cpu::gemm_tiling(o.m, o.n, o.k).tiles_n >
              1);
      Tensor c = run(o, 0.5f, 2.0f);
      const float* A = o.a.data<float>();
      const float* B = o.b.data<float>();
      const float* C0 = o.c.data<float>();
      const float* C = c.data<float>();
      double worst = 0;
      for (int64_t i = 0; i < o.m; ++i) {
        for (int64_t j = 0; j < o.n; ++j) {
          double s = 0, magnitude = 0;
          for (int64_t p = 0; p < o.k; ++p) {
            const double term = double(ta ? A[p * o.lda + i] : A[i * o.lda + p]) *
                                double(tb ? B[j * o.ldb + p] : B[p * o.ldb + j]);
            s += term;
            magnitude += std::fabs(term);
          }
          const double expected = 0.5 * s + 2.0 * C0[i * o.ldc + j];
          // f32 accumulation of K terms: error below K * eps * sum |terms| (the usual bound).
          const double bound =
              o.k * 1.2e-7 * (0.5 * magnitude + 2.0 * std::fabs(C0[i * o.ldc + j]));
          worst = std::max(worst, std::fabs(C[i * o.ldc + j] - expected) / bound);
        }
        for (int64_t j = o.n; j < o.ldc; ++j) REQUIRE(C[i * o.ldc + j] == C0[i * o.ldc + j]);
      }
      CHECK(worst <= 1.0);
    }
}

TEST_CASE("gemm tiles: bits do not depend on threads, nesting or batching", "[core]") {
  test::ThreadGuard guard;
  // K = 1000 is longer than OpenBLAS's K block and not a multiple of its unroll; 1 x 70000 is a
  // vocabulary-sized head row; 8 x 128 x 8192 a weight gradient summed over many tokens.
  const std::vector<std::tuple<int64_t, int64_t, int64_t, bool, bool>> shapes = {
      {1990, 48, 1000, false, true}, {1, 7000, 128, false, true},   {300, 270, 70, true, false},
      {8, 128, 8192, true, false},   {513, 515, 129, false, false}, {64, 64, 128, false, true}};
  for (const auto& [m, n, k, ta, tb] : shapes) {
    INFO(m << " x " << n << " x " << k);
    Operands o = make_operands(m, n, k, ta, tb, 40);
    set_num_threads(1);
    const Tensor one = run(o, 1.0f, 1.0f);
    set_num_threads(2);
    // The library really runs 2 threads (OpenBLAS's OpenMP build resets OpenMP's thread count
    // when told to run single-threaded: set_num_threads must undo that).
    REQUIRE(num_threads() == 2);
    int team = 0;
#pragma omp parallel
#pragma omp single
    team = omp_get_num_threads();
    REQUIRE(team == 2);
    const Tensor two = run(o, 1.0f, 1.0f);
    set_num_threads(3);
    const Tensor three = run(o, 1.0f, 1.0f);
    CHECK(test::bitwise_equal(one, two));
    CHECK(test::bitwise_equal(one, three));
    // Called from inside a parallel loop (the tiles then run on the calling thread).
    set_num_threads(2);
    std::vector<Tensor> nested(2);
#pragma omp parallel for num_threads(2)
    for (int i = 0; i < 2; ++i) nested[i] = run(o, 1.0f, 1.0f);
    CHECK(test::bitwise_equal(one, nested[0]));
    CHECK(test::bitwise_equal(one, nested[1]));
  }
  // A batch of products gives each one the bits it gets alone.
  Operands p = make_operands(700, 300, 96, false, true, 50),
           q = make_operands(20, 600, 512, true, false, 60);
  Tensor pc = p.c.clone(), qc = q.c.clone();
  const cpu::GemmProblem problems[2] = {{false, true, 700, 300, 96, 1.0f, p.a.data<float>(), p.lda,
                                         p.b.data<float>(), p.ldb, 0.0f, pc.data<float>(), p.ldc},
                                        {true, false, 20, 600, 512, 1.0f, q.a.data<float>(), q.lda,
                                         q.b.data<float>(), q.ldb, 0.0f, qc.data<float>(), q.ldc}};
  cpu::sgemm_batch(problems, 2);
  CHECK(test::bitwise_equal(pc, run(p, 1.0f, 0.0f)));
  CHECK(test::bitwise_equal(qc, run(q, 1.0f, 0.0f)));
}
