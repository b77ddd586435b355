// The decode GEMV (backend/cpu/gemv.h) over f32 / bf16 / f16 / Q8_0 weights: against a double
// reference over awkward shapes, each format bitwise equal to the f32 GEMV of its widened
// weights, the scalar and AVX-512 paths bitwise equal, the same bits at 1 and 2 threads, and the
// Q8_0 quantiser's error bound. Shapes: m input rows, out x in weights.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/gemv.h"
#include "kernels/convert.h"
#include "moe/error.h"
#include "moe/rng.h"
#include "moe/threads.h"

using namespace moe;
using cpu::WeightFormat;

namespace {

// A weight matrix of `format` from random values, and its widened f32 copy.
struct Weights {
  WeightFormat format;
  int64_t out, in;
  std::vector<float> f32;      // f32 format: the values; also the widened copy of any format
  std::vector<uint16_t> half;  // bf16 / f16 bits
  std::vector<uint8_t> q8;     // q8_0 rows (values, then block scales)

  Weights(WeightFormat f, int64_t o, int64_t i, uint64_t seed) : format(f), out(o), in(i) {
    std::vector<float> v(static_cast<size_t>(o * i));
    for (size_t j = 0; j < v.size(); ++j) v[j] = rng_normal(seed, j) * 0.5f;
    if (f == WeightFormat::f32) {
      f32 = v;
    } else if (f == WeightFormat::q8_0) {
      q8.resize(static_cast<size_t>(o * cpu::q8_row_bytes(i)));
      for (int64_t r = 0; r < o; ++r)
        cpu::quantize_q8_0_row(v.data() + r * i, i, q8.data() + r * cpu::q8_row_bytes(i));
    } else {
      half.resize(v.size());
      for (size_t j = 0; j < v.size(); ++j)
        half[j] = f == WeightFormat::bf16 ? kernels::f32_to_bf16(v[j]) : kernels::f32_to_f16(v[j]);
    }
    std::vector<float> wide(v.size());
    cpu::widen_rows(matrix(), 0, o, wide.data());
    f32 = wide;
  }
  cpu::WeightMatrix matrix() const {
    cpu::WeightMatrix m;
    m.format = format;
    m.out = out;
    m.in = in;
    m.data = format == WeightFormat::f32    ? static_cast<const void*>(f32.data())
             : format == WeightFormat::q8_0 ? static_cast<const void*>(q8.data())
                                            : static_cast<const void*>(half.data());
    return m;
  }
  cpu::WeightMatrix widened() const {
    cpu::WeightMatrix m;
    m.format = WeightFormat::f32;
    m.out = out;
    m.in = in;
    m.data = f32.data();
    return m;
  }
};

std::vector<float> inputs(int64_t m, int64_t in, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(m * in));
  for (size_t j = 0; j < x.size(); ++j) x[j] = rng_normal(seed, j);
  return x;
}

std::vector<float> run(const cpu::WeightMatrix& w, const std::vector<float>& x, int64_t m,
                       cpu::GemvIsa isa = cpu::GemvIsa::best) {
  std::vector<float> y(static_cast<size_t>(m * w.out), std::nanf(""));
  const cpu::GemvProblem p{w, x.data(), w.in, m, y.data(), w.out, 0.0f};
  cpu::gemv_batch(&p, 1, isa);
  return y;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const WeightFormat kFormats[] = {WeightFormat::f32, WeightFormat::bf16, WeightFormat::f16,
                                 WeightFormat::q8_0};

}  // namespace

TEST_CASE("gemv: every format against a double reference over awkward shapes", "[gemv]") {
  const float eps = std::numeric_limits<float>::epsilon();
  for (WeightFormat f : kFormats)
    for (int64_t in : {1, 15, 16, 17, 31, 32, 33, 100})
      for (int64_t out : {1, 3, 17, 37})
        for (int64_t m : {1, 2, 5, 8}) {
          CAPTURE(cpu::weight_format_name(f), in, out, m);
          const Weights w(f, out, in, uint64_t(in * 1000 + out));
          const std::vector<float> x = inputs(m, in, uint64_t(m + 7 * in));
          const std::vector<float> y = run(w.matrix(), x, m);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t o = 0; o < out; ++o) {
              double ref = 0, mag = 0;
              for (int64_t j = 0; j < in; ++j) {
                const double t = double(w.f32[o * in + j]) * double(x[i * in + j]);
                ref += t;
                mag += std::fabs(t);
              }
              // Recursive summation of `in` terms in f32: |error| <= in * eps * sum |terms|.
              REQUIRE(std::fabs(double(y[i * out + o]) - ref) <= double(in) * eps * mag + 1e-30);
            }
        }
}

TEST_CASE("gemv: each format is bitwise the f32 GEMV of its widened weights", "[gemv]") {
  for (WeightFormat f : kFormats)
    for (int64_t in : {33, 64, 257}) {
      CAPTURE(cpu::weight_format_name(f), in);
      const Weights w(f, 29, in, 5);
      const std::vector<float> x = inputs(3, in, 9);
      CHECK(same_bits(run(w.matrix(), x, 3), run(w.widened(), x, 3)));
    }
}

TEST_CASE("gemv: the scalar and AVX-512 paths give the same bits", "[gemv]") {
  if (!cpu::gemv_isa_supported(cpu::GemvIsa::avx512)) {
    WARN("no AVX-512 on this CPU: only the scalar path runs");
    return;
  }
  for (WeightFormat f : kFormats)
    for (int64_t m = 1; m <= cpu::kGemvMaxRows; ++m) {
      CAPTURE(cpu::weight_format_name(f), m);
      const Weights w(f, 21, 77, 3);
      const std::vector<float> x = inputs(m, 77, 4);
      CHECK(same_bits(run(w.matrix(), x, m, cpu::GemvIsa::scalar),
                      run(w.matrix(), x, m, cpu::GemvIsa::avx512)));
    }
}

TEST_CASE("gemv: a batch of problems gives the same bits at 1 and 2 threads", "[gemv]") {
  // Two experts' rows of one token (as a decode step's grouped GEMM batches them) and a wide one.
  const Weights a(WeightFormat::bf16, 300, 96, 1), b(WeightFormat::q8_0, 300, 96, 2),
      c(WeightFormat::f32, 1000, 130, 3);
  const std::vector<float> x = inputs(2, 130, 5);
  auto batch = [&] {
    std::vector<float> y(300 + 300 + 2000);
    const cpu::GemvProblem p[3] = {{a.matrix(), x.data(), 96, 1, y.data(), 300, 0.0f},
                                   {b.matrix(), x.data(), 96, 1, y.data() + 300, 300, 0.0f},
                                   {c.matrix(), x.data(), 130, 2, y.data() + 600, 1000, 0.0f}};
    cpu::gemv_batch(p, 3);
    return y;
  };
  const int before = num_threads();
  set_num_threads(1);
  const std::vector<float> one = batch();
  set_num_threads(2);
  const std::vector<float> two = batch();
  set_num_threads(before);
  CHECK(same_bits(one, two));
  // Each problem of the batch equals the same problem alone.
  CHECK(same_bits(std::vector<float>(one.begin() + 600, one.end()), run(c.matrix(), x, 2)));
}

TEST_CASE("gemv: beta accumulates into y, bad row counts are refused", "[gemv]") {
  const Weights w(WeightFormat::f16, 9, 40, 8);
  const std::vector<float> x = inputs(1, 40, 2);
  const std::vector<float> fresh = run(w.matrix(), x, 1);
  std::vector<float> y(9, 2.0f);
  cpu::GemvProblem p{w.matrix(), x.data(), 40, 1, y.data(), 9, 1.0f};
  cpu::gemv_batch(&p, 1);
  for (size_t o = 0; o < y.size(); ++o) CHECK(y[o] == fresh[o] + 2.0f);
  p.m = cpu::kGemvMaxRows + 1;
  CHECK_THROWS_WITH(cpu::gemv_batch(&p, 1), Catch::Contains("input rows"));
  p.m = 0;
  CHECK_THROWS_AS(cpu::gemv_batch(&p, 1), Error);
}

TEST_CASE("q8_0: |x - dequantised| <= scale / 2, zero blocks exact, non-finite refused", "[gemv]") {
  for (int64_t n : {1, 31, 32, 33, 100}) {
    CAPTURE(n);
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) x[static_cast<size_t>(j)] = rng_normal(17, uint64_t(j)) * 3.0f;
    if (n >= 64)  // one block of zeros among others
      for (int64_t j = 32; j < 64; ++j) x[static_cast<size_t>(j)] = 0.0f;
    std::vector<uint8_t> row(static_cast<size_t>(cpu::q8_row_bytes(n)));
    cpu::quantize_q8_0_row(x.data(), n, row.data());
    for (int64_t j = 0; j < n; ++j) {
      const float scale = cpu::q8_scale(row.data(), n, j / cpu::kQ8Block);
      const int8_t q = static_cast<int8_t>(row[static_cast<size_t>(j)]);
      const float deq = scale * float(q);
      REQUIRE(std::fabs(x[static_cast<size_t>(j)] - deq) <= scale / 2);
      REQUIRE(q >= -127);
      if (x[static_cast<size_t>(j)] == 0.0f) REQUIRE(deq == 0.0f);
    }
    if (n >= 64) CHECK(cpu::q8_scale(row.data(), n, 1) == 0.0f);
  }
  std::vector<float> zeros(40, 0.0f);
  std::vector<uint8_t> row(static_cast<size_t>(cpu::q8_row_bytes(40)), 5);
  cpu::quantize_q8_0_row(zeros.data(), 40, row.data());
  for (uint8_t v : row) CHECK(v == 0);
  zeros[3] = std::nanf("");
  CHECK_THROWS_WITH(cpu::quantize_q8_0_row(zeros.data(), 40, row.data()),
                    Catch::Contains("element 3 is not finite"));
}

TEST_CASE("gemv: widen_rows gives each element's exact value (vector and tail paths)", "[gemv]") {
  // Checked element by element against the scalar conversions, over rows whose length leaves a
  // tail of every size class, with f16 subnormals and zeros among the values.
  for (const int64_t in : {1, 15, 16, 17, 40, 95}) {
    for (WeightFormat f : kFormats) {
      Weights w(f, 3, in, 20 + static_cast<uint64_t>(in));
      if (f == WeightFormat::f16) {
        w.half[0] = 0x0001;                            // the smallest subnormal
        w.half[static_cast<size_t>(in) - 1] = 0x83ff;  // the largest negative subnormal
        w.half[static_cast<size_t>(in)] = 0x8000;      // -0
      }
      std::vector<float> got(static_cast<size_t>(3 * in), std::nanf(""));
      cpu::widen_rows(w.matrix(), 0, 3, got.data());
      bool exact = true;
      for (int64_t o = 0; o < 3; ++o)
        for (int64_t j = 0; j < in; ++j) {
          const size_t at = static_cast<size_t>(o * in + j);
          float expect = 0;
          if (f == WeightFormat::f32) {
            expect = w.f32[at];
          } else if (f == WeightFormat::bf16) {
            expect = kernels::bf16_to_f32(w.half[at]);
          } else if (f == WeightFormat::f16) {
            expect = kernels::f16_to_f32(w.half[at]);
          } else {
            const uint8_t* row = w.q8.data() + o * cpu::q8_row_bytes(in);
            expect = cpu::q8_scale(row, in, j / cpu::kQ8Block) *
                     static_cast<float>(static_cast<int8_t>(row[j]));
          }
          exact = exact && std::memcmp(&expect, &got[at], sizeof(float)) == 0;
        }
      INFO(cpu::weight_format_name(f) << ", in " << in);
      CHECK(exact);
    }
  }
}
