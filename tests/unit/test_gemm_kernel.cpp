// The AVX-512 tile kernel of cpu::sgemm (backend/cpu/gemm_avx512.cpp) against an fp64 loop and
// against the scalar sums it promises (each element: per k block, an FMA chain from zero over
// the block's k in order; block sums added in order; then alpha * sum, then + beta * C by one
// FMA), over awkward shapes; its bits at 1 and 2 threads; a
// row's bits whatever rows share the call; the CBLAS kernel and ours agreeing to fp32 accuracy;
// and the kernel choice (CPU features, MOE_GEMM). On a CPU without AVX-512 the kernel tests check
// that asking for it is refused. Shapes: C [M,N] = alpha op(A) [M,K] op(B) [K,N] + beta C.
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_kernel.h"
#include "moe/error.h"
#include "support/bits.h"
#include "support/gemm_kernel.h"
#include "support/gradcheck.h"

using namespace moe;

namespace {

// Operands with leading dimensions wider than needed (views into larger rows); C's padding
// columns must be left alone.
struct Operands {
  int64_t m, n, k, lda, ldb, ldc;
  bool ta, tb;
  Tensor a, b, c;
};

Operands make_operands(int64_t m, int64_t n, int64_t k, bool ta, bool tb, uint64_t seed) {
  Operands o{m, n, k, (ta ? m : k) + 3, (tb ? k : n) + 5, n + 7, ta, tb, {}, {}, {}};
  o.a = test::random_tensor({std::max<int64_t>(ta ? k : m, 1), o.lda}, seed);
  o.b = test::random_tensor({std::max<int64_t>(tb ? n : k, 1), o.ldb}, seed + 1);
  o.c = test::random_tensor({m, o.ldc}, seed + 2);
  return o;
}

float a_at(const Operands& o, int64_t i, int64_t p) {
  return o.ta ? o.a.data<float>()[p * o.lda + i] : o.a.data<float>()[i * o.lda + p];
}
float b_at(const Operands& o, int64_t p, int64_t j) {
  return o.tb ? o.b.data<float>()[j * o.ldb + p] : o.b.data<float>()[p * o.ldb + j];
}

Tensor run_sgemm(const Operands& o, float alpha, float beta) {
  Tensor c = o.c.clone();
  cpu::sgemm(o.ta, o.tb, o.m, o.n, o.k, alpha, o.a.data<float>(), o.lda, o.b.data<float>(), o.ldb,
             beta, c.data<float>(), o.ldc);
  return c;
}

// The whole product as one tile of the AVX-512 kernel (no tiling, no size threshold).
Tensor run_tile(const Operands& o, float alpha, float beta) {
  Tensor c = o.c.clone();
  const cpu::GemmProblem p{o.ta,
                           o.tb,
                           o.m,
                           o.n,
                           o.k,
                           alpha,
                           o.a.data<float>(),
                           o.lda,
                           o.b.data<float>(),
                           o.ldb,
                           beta,
                           c.data<float>(),
                           o.ldc};
  cpu::sgemm_tile_avx512(p, o.m, o.n, p.a, p.b, p.c);
  return c;
}

// Checks `c` (the product with alpha, beta) element by element: bitwise against the scalar FMA
// chain, and within the fp32 error bound of the fp64 sum. Returns the worst error / bound.
double check_product(const Operands& o, float alpha, float beta, const Tensor& c) {
  const float* C0 = o.c.data<float>();
  const float* C = c.data<float>();
  // fp32 sums of K products, one rounding per FMA or block addition, then alpha and beta: below
  // (K + 2) u times the sum of magnitudes (u = FLT_EPSILON / 2, to first order; the usual gamma
  // bound, which the blocked sum also meets).
  const double u = FLT_EPSILON / 2;
  const int64_t k_block = cpu::gemm_avx512_k_block(o.k);
  double worst = 0;
  int64_t chain_mismatches = 0;
  for (int64_t i = 0; i < o.m; ++i) {
    for (int64_t j = 0; j < o.n; ++j) {
      double exact = 0, magnitude = 0;
      float chain = 0.0f, block = 0.0f;
      for (int64_t p = 0; p < o.k; ++p) {
        const float x = a_at(o, i, p), y = b_at(o, p, j);
        exact += double(x) * double(y);
        magnitude += std::fabs(double(x) * double(y));
        block = std::fma(x, y, block);
        if ((p + 1) % k_block == 0 || p + 1 == o.k) {  // the block's sum joins the total
          chain = p + 1 <= k_block ? block : chain + block;
          block = 0.0f;
        }
      }
      const float c0 = C0[i * o.ldc + j];
      float promised = alpha * chain;
      if (beta != 0.0f) promised = std::fma(beta, c0, promised);
      const double expected = alpha * exact + (beta != 0.0f ? beta * double(c0) : 0.0);
      const double bound =
          (o.k + 2) * u * (std::fabs(alpha) * magnitude + std::fabs(beta * double(c0))) +
          std::numeric_limits<float>::denorm_min();
      const float got = C[i * o.ldc + j];
      worst = std::max(worst, std::fabs(got - expected) / bound);
      if (std::memcmp(&got, &promised, sizeof got) != 0) ++chain_mismatches;
    }
    for (int64_t j = o.n; j < o.ldc; ++j)
      REQUIRE(std::memcmp(&C[i * o.ldc + j], &C0[i * o.ldc + j], sizeof(float)) == 0);
  }
  CHECK(chain_mismatches == 0);
  return worst;
}

// True where this CPU runs the AVX-512 kernel; elsewhere checks that asking for it is refused
// (so the kernel tests assert something on every host).
bool avx512_here() {
  if (cpu::gemm_avx512_supported()) return true;
  CHECK_THROWS_AS(cpu::set_gemm_kernel(cpu::GemmKernel::avx512), UsageError);
  return false;
}

}  // namespace

TEST_CASE("gemm kernel: the choice follows the CPU, and avx512 is refused without AVX-512",
          "[core]") {
  test::GemmKernelGuard guard;
  CHECK(cpu::gemm_kernel_supported(cpu::GemmKernel::blas));
  CHECK(cpu::gemm_kernel_supported(cpu::GemmKernel::avx512) == cpu::gemm_avx512_supported());
  if (!cpu::gemm_avx512_supported()) {
    CHECK_THROWS_AS(cpu::set_gemm_kernel(cpu::GemmKernel::avx512), UsageError);
    CHECK(cpu::gemm_kernel() == cpu::GemmKernel::blas);
  }
  cpu::set_gemm_kernel(cpu::GemmKernel::blas);
  CHECK(cpu::gemm_kernel() == cpu::GemmKernel::blas);
  CHECK(std::string(cpu::gemm_kernel_name(cpu::GemmKernel::avx512)) == "avx512");
}

TEST_CASE("gemm kernel: avx512 matches fp64 and its blocked FMA chains over awkward shapes",
          "[core]") {
  if (!avx512_here()) return;
  // 1s, odd sizes, sizes around the 14 x 32 register block and the 256 k block (one more, one
  // less, several blocks), a single row and a single column; last row panels of 1, 3, 4, 6, 8,
  // 13 rows (the 4-, 7-, 10- and 14-row edge kernels).
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {1, 1, 1},     {1, 37, 5},  {13, 1, 9},    {14, 32, 256}, {15, 33, 257}, {27, 63, 255},
      {29, 65, 513}, {3, 100, 1}, {50, 17, 700}, {130, 31, 64}, {20, 45, 300}};
  const std::vector<std::pair<float, float>> scalars = {
      {1.0f, 0.0f}, {1.0f, 1.0f}, {0.5f, -2.0f}, {0.0f, 1.5f}, {-1.25f, 0.0f}};
  uint64_t seed = 100;
  for (const auto& [m, n, k] : shapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (const auto& [alpha, beta] : scalars) {
          INFO(m << " x " << n << " x " << k << " transpose a " << ta << " b " << tb << " alpha "
                 << alpha << " beta " << beta);
          const Operands o = make_operands(m, n, k, ta, tb, seed += 3);
          CHECK(check_product(o, alpha, beta, run_tile(o, alpha, beta)) <= 1.0);
        }
}

TEST_CASE("gemm kernel: through sgemm, k = 0, beta = 0 over NaN, and many tiles", "[core]") {
  if (!avx512_here()) return;
  test::GemmKernelGuard guard;
  cpu::set_gemm_kernel(cpu::GemmKernel::avx512);
  // k = 0: C = beta C (alpha times an empty sum).
  Operands empty = make_operands(20, 40, 0, false, false, 7);
  const Tensor scaled = run_sgemm(empty, 1.0f, 0.5f);
  for (int64_t i = 0; i < 20; ++i)
    for (int64_t j = 0; j < 40; ++j)
      REQUIRE(scaled.data<float>()[i * empty.ldc + j] ==
              0.5f * empty.c.data<float>()[i * empty.ldc + j]);
  // beta = 0 never reads C: NaN there must not come through. Ragged tiles, every one wide and
  // tall enough for our kernel (narrower ones go to CBLAS), so check_product's bits apply.
  Operands o = make_operands(300, 290, 600, true, false, 9);
  const cpu::GemmTiling t = cpu::gemm_tiling(o.m, o.n, o.k);
  REQUIRE(t.tiles_m * t.tiles_n > 1);
  REQUIRE(o.m - (t.tiles_m - 1) * t.tile_m >= cpu::kGemmAvx512MinRows);
  REQUIRE(o.n - (t.tiles_n - 1) * t.tile_n >= cpu::kGemmAvx512MinCols);
  float* c0 = o.c.data<float>();
  for (int64_t i = 0; i < o.m; ++i) c0[i * o.ldc + 5] = std::numeric_limits<float>::quiet_NaN();
  const Tensor c = run_sgemm(o, 1.0f, 0.0f);
  CHECK(check_product(o, 1.0f, 0.0f, c) <= 1.0);
}

TEST_CASE("gemm kernel: avx512 bits at 1 and 2 threads, and a row's bits whatever shares the call",
          "[core]") {
  if (!avx512_here()) return;
  test::GemmKernelGuard guard;
  test::ThreadGuard threads;
  cpu::set_gemm_kernel(cpu::GemmKernel::avx512);
  for (const auto& [m, n, k, ta, tb] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, bool, bool>>{
           {1990, 48, 1000, false, true},
           {513, 530, 129, false, false},
           {16, 700, 8192, true, false}}) {
    INFO(m << " x " << n << " x " << k);
    REQUIRE(m >= 12);  // rows 5..11 are taken below
    // Every tile is one of ours (none narrower than kGemmAvx512MinCols, which go to CBLAS).
    const cpu::GemmTiling t = cpu::gemm_tiling(m, n, k);
    REQUIRE(n - (t.tiles_n - 1) * t.tile_n >= cpu::kGemmAvx512MinCols);
    const Operands o = make_operands(m, n, k, ta, tb, 40);
    set_num_threads(1);
    const Tensor one = run_sgemm(o, 1.0f, 1.0f);
    set_num_threads(2);
    const Tensor two = run_sgemm(o, 1.0f, 1.0f);
    CHECK(test::bitwise_equal(one, two));
    // Rows 5..11 of op(A) alone (a different tile grid, a different place in the register
    // block): each element is the same sums, so the same bits.
    Tensor part = o.c.clone();
    const float* a_rows = o.a.data<float>() + (ta ? 5 : 5 * o.lda);
    cpu::sgemm(ta, tb, 7, n, k, 1.0f, a_rows, o.lda, o.b.data<float>(), o.ldb, 1.0f,
               part.data<float>() + 5 * o.ldc, o.ldc);
    int64_t differ = 0;
    for (int64_t i = 5; i < 12; ++i)
      differ += std::memcmp(part.data<float>() + i * o.ldc, one.data<float>() + i * o.ldc,
                            sizeof(float) * n) != 0;
    CHECK(differ == 0);
  }
}

TEST_CASE("gemm kernel: the CBLAS and AVX-512 kernels agree to fp32 accuracy", "[core]") {
  if (!avx512_here()) return;
  test::GemmKernelGuard guard;
  // Each kernel sums in its own order (the BLAS's blocking is its own), so they differ by
  // rounding: each is within the (K + 2) u bound of the exact sum (check_product checks ours),
  // so they are within twice that of each other. Shapes of an expert GEMM (forward, dX, dW).
  const double u = FLT_EPSILON / 2;
  for (const auto& [m, n, k, ta, tb] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, bool, bool>>{
           {256, 512, 128, false, false},
           {256, 128, 512, false, true},
           {128, 512, 256, true, false}}) {
    INFO(m << " x " << n << " x " << k);
    const Operands o = make_operands(m, n, k, ta, tb, 70);
    // Each product is the kernel named (so this never compares a kernel with itself).
    cpu::set_gemm_kernel(cpu::GemmKernel::blas);
    REQUIRE(cpu::gemm_kernel() == cpu::GemmKernel::blas);
    const Tensor blas = run_sgemm(o, 1.0f, 0.0f);
    cpu::set_gemm_kernel(cpu::GemmKernel::avx512);
    REQUIRE(cpu::gemm_kernel() == cpu::GemmKernel::avx512);
    const Tensor ours = run_sgemm(o, 1.0f, 0.0f);
    double worst = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double magnitude = 0;
        for (int64_t p = 0; p < k; ++p)
          magnitude += std::fabs(double(a_at(o, i, p)) * b_at(o, p, j));
        const double diff = std::fabs(double(blas.data<float>()[i * o.ldc + j]) -
                                      ours.data<float>()[i * o.ldc + j]);
        worst = std::max(worst, diff / (2 * (k + 2) * u * magnitude));
      }
    CHECK(worst <= 1.0);
    // Whether the bits differ depends on the BLAS's kernel: with OpenBLAS left to choose its own
    // on an AMD Zen 4, every element was the same, so the test asks for the bound alone.
  }
}

TEST_CASE("gemm kernel: panels kept from tile to tile are never reused by a later call", "[core]") {
  if (!avx512_here()) return;
  test::GemmKernelGuard guard;
  test::ThreadGuard threads;
  cpu::set_gemm_kernel(cpu::GemmKernel::avx512);
  // One thread runs every tile, so each tile after the first finds the panels of its tile row
  // (A) or column (B) kept: here 8 tiles in one column share op(B), and K 600 keeps 3 k blocks.
  set_num_threads(1);
  Operands o = make_operands(2048, 64, 600, false, true, 60);
  const cpu::GemmTiling t = cpu::gemm_tiling(o.m, o.n, o.k);
  REQUIRE(t.tiles_m > 1);
  REQUIRE(t.tiles_n == 1);
  CHECK(check_product(o, 1.0f, 0.0f, run_sgemm(o, 1.0f, 0.0f)) <= 1.0);
  // New values at the same addresses (an optimizer's update, an arena's next step): a call that
  // found the last call's panels kept would multiply the old values.
  for (Tensor* x : {&o.a, &o.b}) {
    float* v = x->data<float>();
    for (int64_t i = 0; i < x->numel(); ++i) v[i] = 0.5f - v[i];
  }
  CHECK(check_product(o, 1.0f, 0.0f, run_sgemm(o, 1.0f, 0.0f)) <= 1.0);
}
