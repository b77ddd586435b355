// Attention's causal softmax rows on the CPU (backend/cpu/activation_rows.h: one copy per vector
// instruction set of kernels::causal_softmax_row and its backward, the bodies a GPU thread runs):
// every copy gives the kernel body's bits at every row length, and the rows are as accurate as
// their operations allow against the softmax in double.
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/activation_rows.h"
#include "kernels/attention.h"
#include "moe/error.h"

using namespace moe;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A row of `keys` scores: normal values of spread `sigma` (the last `keys - visible` are garbage
// the softmax must overwrite), and d loss / d probs of the same shape.
struct Row {
  std::vector<float> scores, dprobs;
  Row(int64_t keys, float sigma, std::mt19937& rng) : scores(keys), dprobs(keys) {
    std::normal_distribution<float> normal(0.0f, sigma), unit(0.0f, 1.0f);
    for (int64_t j = 0; j < keys; ++j) {
      scores[j] = normal(rng);
      dprobs[j] = unit(rng);
    }
  }
};

}  // namespace

// Lengths around every multiple of 16 (the lanes' blocks) up to 300, and a key count past the
// visible ones: each copy must give the kernel body's bits, forward and backward, and write exact
// zeros past the visible keys. A copy that fused the backward's multiply and add, summed the
// exponentials in another order or called another exp would differ here. The keys past `visible`
// hold NaN (the backward's d there is whatever the product left): a row whose last partial block
// is read in place must give the visible keys the bits of the same row with no keys past them
// (whose last block runs through a local one).
TEST_CASE("softmax rows: every copy gives the kernel body's bits at every row length",
          "[activation]") {
  std::mt19937 rng(7);
  const std::vector<cpu::VectorIsa> copies = cpu::vector_isas_supported();
  REQUIRE(copies.front() == cpu::VectorIsa::baseline);
  int64_t rows = 0;
  for (int64_t visible = 1; visible <= 300; visible += visible < 40 ? 1 : 7) {
    for (int64_t extra : {0, 1, 19}) {
      const int64_t keys = visible + extra;
      Row row(keys, visible % 3 == 0 ? 8.0f : 1.0f, rng);
      for (int64_t j = visible; j < keys; ++j) row.scores[j] = row.dprobs[j] = NAN;
      const float scale = 0.125f;
      std::vector<float> p_body = row.scores, d_body = row.dprobs;
      kernels::causal_softmax_row(p_body.data(), visible, keys);
      kernels::causal_softmax_backward_row(p_body.data(), d_body.data(), visible, keys, scale);
      for (int64_t j = visible; j < keys; ++j) REQUIRE((p_body[j] == 0.0f && d_body[j] == 0.0f));
      std::vector<float> p_short(row.scores.begin(), row.scores.begin() + visible),
          d_short(row.dprobs.begin(), row.dprobs.begin() + visible);
      kernels::causal_softmax_row(p_short.data(), visible, visible);
      kernels::causal_softmax_backward_row(p_short.data(), d_short.data(), visible, visible, scale);
      REQUIRE(std::memcmp(p_short.data(), p_body.data(), visible * sizeof(float)) == 0);
      REQUIRE(std::memcmp(d_short.data(), d_body.data(), visible * sizeof(float)) == 0);
      for (cpu::VectorIsa isa : copies) {
        INFO(cpu::vector_isa_name(isa) << ": visible " << visible << " of " << keys);
        std::vector<float> p = row.scores, d = row.dprobs;
        cpu::causal_softmax_row_on(isa, p.data(), visible, keys);
        REQUIRE(same_bits(p, p_body));
        cpu::causal_softmax_backward_row_on(isa, p.data(), d.data(), visible, keys, scale);
        REQUIRE(same_bits(d, d_body));
      }
      ++rows;
    }
  }
  // The entry the attention op calls runs the process's copy: the same bits.
  std::vector<float> p = Row(77, 2.0f, rng).scores, p_body = p;
  cpu::causal_softmax_row(p.data(), 70, 77);
  kernels::causal_softmax_row(p_body.data(), 70, 77);
  CHECK(same_bits(p, p_body));
  CHECK(rows > 100);
}

// Against the softmax in double of the same float scores. Forward, each p_j relative to its exact
// value: x_j - m rounds by at most u |x_j - m| (u = 2^-24), which exp turns into that relative
// error; exp_f adds at most 0.99 ulp (under 2u); the sum of n positive terms in 16 lanes and a
// tree of 4 takes at most (n / 16 + 4) roundings of u of the sum, on top of its terms' own
// errors; the reciprocal and the product one u each. So |p - exact| <= (2 (R + 2) + n / 16 + 6) u
// exact, R the largest |x_j - m|, and FLT_MIN more where exact is that small (exp_f's results
// below 2^-126 are subnormal, and 0 below e^-104). Backward, d_j = scale p_j (g_j - dot): the
// dot product of n terms errs by at most (n / 16 + 4) u sum |p_i g_i| (its products' roundings
// one u each more), the difference and the two products three u of their values, and p_j brings
// its own error.
TEST_CASE("softmax rows: forward and backward within their rounding bounds of double",
          "[activation]") {
  std::mt19937 rng(11);
  const double u = FLT_EPSILON / 2;
  const float scale = 0.125f;
  for (int64_t visible : {1, 2, 15, 16, 17, 33, 64, 100, 128, 257, 512}) {
    for (float sigma : {0.5f, 4.0f, 20.0f}) {
      INFO("visible " << visible << ", scores of spread " << sigma);
      const Row row(visible, sigma, rng);
      std::vector<float> p = row.scores, d = row.dprobs;
      cpu::causal_softmax_row(p.data(), visible, visible);
      cpu::causal_softmax_backward_row(p.data(), d.data(), visible, visible, scale);

      double m = row.scores[0];
      for (float x : row.scores) m = std::max(m, double(x));
      double sum = 0, spread = 0;
      std::vector<double> exact(visible);
      for (int64_t j = 0; j < visible; ++j) {
        exact[j] = std::exp(double(row.scores[j]) - m);
        sum += exact[j];
        spread = std::max(spread, m - row.scores[j]);
      }
      const double n = double(visible);
      const double p_rel = (2 * (spread + 2) + n / 16 + 6) * u;
      double dot = 0, dot_mag = 0;
      for (int64_t j = 0; j < visible; ++j) {
        exact[j] /= sum;
        REQUIRE(std::fabs(p[j] - exact[j]) <= p_rel * exact[j] + FLT_MIN);
        dot += exact[j] * row.dprobs[j];
        dot_mag += exact[j] * std::fabs(row.dprobs[j]);
      }
      const double dot_err = (n / 16 + 5) * u * dot_mag + p_rel * dot_mag;
      for (int64_t j = 0; j < visible; ++j) {
        const double g = row.dprobs[j], want = scale * exact[j] * (g - dot);
        const double bound =
            scale * (exact[j] * (dot_err + 3 * u * (std::fabs(g) + std::fabs(dot))) +
                     (p_rel * exact[j] + FLT_MIN) * std::fabs(g - dot));
        REQUIRE(std::fabs(d[j] - want) <= bound + DBL_MIN);
      }
    }
  }
}

TEST_CASE("softmax rows: a copy this CPU lacks is refused", "[activation]") {
  float p[2] = {1.0f, 2.0f}, d[2] = {0.5f, 0.25f};
  for (cpu::VectorIsa isa : {cpu::VectorIsa::avx2, cpu::VectorIsa::avx512}) {
    if (cpu::vector_isa_supported(isa)) continue;
    INFO(cpu::vector_isa_name(isa));
    CHECK_THROWS_AS(cpu::causal_softmax_row_on(isa, p, 2, 2), UsageError);
    CHECK_THROWS_AS(cpu::causal_softmax_backward_row_on(isa, p, d, 2, 2, 1.0f), UsageError);
  }
  cpu::causal_softmax_row_on(cpu::VectorIsa::baseline, p, 2, 2);  // every x86-64 CPU has it
  CHECK(std::fabs(p[0] - 1 / (1 + std::exp(1.0))) <= 4 * FLT_EPSILON);
  CHECK(std::fabs(p[1] - 1 / (1 + std::exp(-1.0))) <= 4 * FLT_EPSILON);
}
