// The decode GEMV (backend/cpu/gemv.h) over f32 / bf16 / f16 / Q8_0 weights: against a double
// reference over awkward shapes (Q8_0: the exact integer products of its quantised inputs), the
// 16-bit formats bitwise equal to the f32 GEMV of their widened weights and Q8_0 within its
// inputs' rounding of it, the scalar and AVX-512 (with and without VNNI) paths bitwise equal, the
// same bits at 1 and 2 threads, and the Q8_0 quantisers' error bounds. Shapes: m input rows,
// out x in weights.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/gemv.h"
#include "backend/cpu/gemv_q8.h"
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
  std::vector<float> f32;       // f32 format: the values; also the widened copy of any format
  std::vector<uint16_t> half;   // bf16 / f16 bits
  std::vector<uint8_t> q8;      // q8_0 rows (values, then block scales), as files hold them
  std::vector<uint8_t> groups;  // the same as the kernels' row groups (pack_q8_0)

  Weights(WeightFormat f, int64_t o, int64_t i, uint64_t seed) : format(f), out(o), in(i) {
    std::vector<float> v(static_cast<size_t>(o * i));
    for (size_t j = 0; j < v.size(); ++j) v[j] = rng_normal(seed, j) * 0.5f;
    if (f == WeightFormat::f32) {
      f32 = v;
    } else if (f == WeightFormat::q8_0) {
      q8.resize(static_cast<size_t>(o * cpu::q8_row_bytes(i)));
      for (int64_t r = 0; r < o; ++r)
        cpu::quantize_q8_0_row(v.data() + r * i, i, q8.data() + r * cpu::q8_row_bytes(i));
      pack();
    } else {
      half.resize(v.size());
      for (size_t j = 0; j < v.size(); ++j)
        half[j] = f == WeightFormat::bf16 ? kernels::f32_to_bf16(v[j]) : kernels::f32_to_f16(v[j]);
    }
    std::vector<float> wide(v.size());
    cpu::widen_rows(matrix(), 0, o, wide.data());
    f32 = wide;
  }
  // Row groups of the rows in q8 (again after an edit of q8).
  void pack() {
    groups.resize(static_cast<size_t>(out * cpu::q8_group_row_bytes(in)));
    cpu::pack_q8_0(q8.data(), out, in, groups.data());
  }
  cpu::WeightMatrix matrix() const {
    cpu::WeightMatrix m;
    m.format = format;
    m.out = out;
    m.in = in;
    m.data = format == WeightFormat::f32    ? static_cast<const void*>(f32.data())
             : format == WeightFormat::q8_0 ? static_cast<const void*>(groups.data())
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

// Q8_0's exact value: each block's integer sum of its weights and its quantised inputs
// (quantize_q8_input_row), times both scales, in double; mag sums the terms' magnitudes.
void q8_reference(const Weights& w, const std::vector<float>& x, int64_t i, int64_t o, double& ref,
                  double& mag) {
  const int64_t in = w.in, blocks = cpu::q8_blocks(in);
  std::vector<int8_t> q(static_cast<size_t>(in));
  std::vector<float> s(static_cast<size_t>(blocks));
  cpu::quantize_q8_input_row(x.data() + i * in, in, q.data(), s.data());
  const uint8_t* row = w.q8.data() + o * cpu::q8_row_bytes(in);
  ref = mag = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const double scale = double(cpu::q8_scale(row, in, b)) * double(s[static_cast<size_t>(b)]);
    for (int64_t j = b * cpu::kQ8Block; j < std::min(in, (b + 1) * cpu::kQ8Block); ++j) {
      const double t = scale * double(static_cast<int8_t>(row[j])) * double(q[size_t(j)]);
      ref += t;
      mag += std::fabs(t);
    }
  }
}

// How far quantize_q8_input_row may move element j of x (its header's bound). With s = max|x| /
// 127 of j's block in f32 and scale the block's f16 one: q is within half a step u of x, where
// u = 1 / (x's product with the multiplier 127 / max|x|, over x) is within three f32 roundings
// (2^-24 each: s, the multiplier, the product) of s, so |x - s q| <= s / 2 + 127 x 3 x 2^-24 s
// (128 x 2^-22 s covers it and u / 2 - s / 2); scale q moves by 127 |scale - s| more.
double input_moved(const float* x, int64_t n, int64_t j, const float* scale) {
  const int64_t b = j / cpu::kQ8Block;
  float amax = 0;
  for (int64_t k = b * cpu::kQ8Block; k < std::min(n, (b + 1) * cpu::kQ8Block); ++k)
    amax = std::max(amax, std::fabs(x[k]));
  const double s = double(amax / 127.0f);
  return s * (0.5 + 128 * std::ldexp(1.0, -22)) + 127 * std::fabs(double(scale[b]) - s);
}

}  // namespace

TEST_CASE("gemv: every format against a double reference over awkward shapes", "[gemv]") {
  const float eps = std::numeric_limits<float>::epsilon();
  for (WeightFormat f : kFormats)
    for (int64_t in : {1, 15, 16, 17, 31, 32, 33, 64, 65, 100, 129})
      for (int64_t out : {1, 3, 17, 37})
        for (int64_t m : {1, 2, 5, 8}) {
          CAPTURE(cpu::weight_format_name(f), in, out, m);
          const Weights w(f, out, in, uint64_t(in * 1000 + out));
          const std::vector<float> x = inputs(m, in, uint64_t(m + 7 * in));
          const std::vector<float> y = run(w.matrix(), x, m);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t o = 0; o < out; ++o) {
              double ref = 0, mag = 0, bound = 0;
              if (f == WeightFormat::q8_0) {
                // Integer sums are exact; each lane rounds its pairs' scale products and fused
                // adds (pairs + 1 roundings of eps / 2), the tree 4 more: (pairs + 5) eps / 2,
                // doubled for second-order terms.
                q8_reference(w, x, i, o, ref, mag);
                bound = double(cpu::q8_blocks(in) / 2 + 6) * eps * mag;
              } else {
                for (int64_t j = 0; j < in; ++j) {
                  const double t = double(w.f32[o * in + j]) * double(x[i * in + j]);
                  ref += t;
                  mag += std::fabs(t);
                }
                // Recursive summation of `in` terms in f32: |error| <= in * eps * sum |terms|.
                bound = double(in) * eps * mag;
              }
              REQUIRE(std::fabs(double(y[i * out + o]) - ref) <= bound + 1e-30);
            }
        }
}

TEST_CASE("gemv: f32, bf16 and f16 are bitwise the f32 GEMV of their widened weights", "[gemv]") {
  for (WeightFormat f : {WeightFormat::f32, WeightFormat::bf16, WeightFormat::f16})
    for (int64_t in : {33, 64, 257}) {
      CAPTURE(cpu::weight_format_name(f), in);
      const Weights w(f, 29, in, 5);
      const std::vector<float> x = inputs(3, in, 9);
      CHECK(same_bits(run(w.matrix(), x, 3), run(w.widened(), x, 3)));
    }
}

TEST_CASE("gemv: Q8_0 is the f32 GEMV of its dequantised weights up to the inputs' rounding",
          "[gemv]") {
  // Quantising an input moves it by at most input_moved (half a step, and the f16 rounding of
  // the step times 127), so the products move by at most that times |w|; both GEMVs' own f32
  // rounding comes on top (in eps sum |terms| each).
  const float eps = std::numeric_limits<float>::epsilon();
  for (int64_t in : {40, 256, 1000}) {
    CAPTURE(in);
    const Weights w(WeightFormat::q8_0, 23, in, 31);
    const std::vector<float> x = inputs(2, in, 32);
    const std::vector<float> y = run(w.matrix(), x, 2), wide = run(w.widened(), x, 2);
    bool moved = false;
    for (int64_t i = 0; i < 2; ++i) {
      std::vector<int8_t> q(static_cast<size_t>(in));
      std::vector<float> s(static_cast<size_t>(cpu::q8_blocks(in)));
      cpu::quantize_q8_input_row(x.data() + i * in, in, q.data(), s.data());
      for (int64_t o = 0; o < w.out; ++o) {
        double bound = 0, mag = 0;
        for (int64_t j = 0; j < in; ++j) {
          const double wj = std::fabs(double(w.f32[o * in + j]));
          bound += input_moved(x.data() + i * in, in, j, s.data()) * wj;
          mag += wj * std::fabs(double(x[i * in + j]));
        }
        const double d = std::fabs(double(y[i * w.out + o]) - double(wide[i * w.out + o]));
        REQUIRE(d <= bound + 2.0 * double(in) * eps * (mag + bound));
        moved = moved || d > 0;
      }
    }
    CHECK(moved);  // the inputs were quantised: not the f32 path
  }
}

TEST_CASE("gemv: the scalar and AVX-512 paths give the same bits", "[gemv]") {
  if (!cpu::gemv_isa_supported(cpu::GemvIsa::avx512)) {
    WARN("no AVX-512 on this CPU: only the scalar path runs");
    return;
  }
  std::vector<cpu::GemvIsa> wide = {cpu::GemvIsa::avx512};
  if (cpu::gemv_isa_supported(cpu::GemvIsa::avx512_vnni))
    wide.push_back(cpu::GemvIsa::avx512_vnni);
  else
    WARN("no AVX-512 VNNI on this CPU: its Q8_0 path is not compared");
  // in 544 and 1100: more than 16 Q8_0 blocks a row (17; 35, the last pair half empty), so the
  // AVX-512 rows widen their block scales in more than one group.
  for (WeightFormat f : kFormats)
    for (int64_t in : {77, 64, 130, 544, 1100})
      for (int64_t m = 1; m <= cpu::kGemvMaxRows; ++m)
        for (cpu::GemvIsa isa : wide) {
          CAPTURE(cpu::weight_format_name(f), in, m, int(isa));
          Weights w(f, 21, in, 3);
          if (f == WeightFormat::q8_0) {
            w.q8[5] = 0x80;  // -128, outside the quantiser's range
            w.pack();
          }
          const std::vector<float> x = inputs(m, in, 4);
          CHECK(same_bits(run(w.matrix(), x, m, cpu::GemvIsa::scalar), run(w.matrix(), x, m, isa)));
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

TEST_CASE("q8_0: a row's bytes give back its length, and no other byte count does", "[gemv]") {
  std::vector<int64_t> in_of(5000, 0);
  for (int64_t in = 1; cpu::q8_row_bytes(in) < int64_t(in_of.size()); ++in)
    in_of[size_t(cpu::q8_row_bytes(in))] = in;
  for (int64_t bytes = -2; bytes < int64_t(in_of.size()); ++bytes) {
    INFO("bytes " << bytes);
    CHECK(cpu::q8_in_of_row_bytes(bytes) == (bytes > 0 ? in_of[size_t(bytes)] : 0));
  }
  CHECK(cpu::q8_in_of_row_bytes(cpu::q8_row_bytes(4096)) == 4096);
}

TEST_CASE("q8_0: row groups hold every row's bytes where the layout says, and unpack back",
          "[gemv]") {
  // Row counts with no group, one partial group, whole groups and a partial last one; row lengths
  // with a partial block, a partial pair and whole pairs.
  for (const int64_t out : {1, 5, 8, 9, 16, 21})
    for (const int64_t in : {1, 31, 32, 33, 64, 77, 130, 192}) {
      CAPTURE(out, in);
      const int64_t row_bytes = cpu::q8_row_bytes(in), group_row = cpu::q8_group_row_bytes(in);
      std::vector<uint8_t> rows(static_cast<size_t>(out * row_bytes));
      for (size_t b = 0; b < rows.size(); ++b) rows[b] = static_cast<uint8_t>(b * 7 + 1);
      std::vector<uint8_t> groups(static_cast<size_t>(out * group_row), 0xee);
      cpu::pack_q8_0(rows.data(), out, in, groups.data());
      std::vector<uint8_t> back(rows.size());
      cpu::unpack_q8_0(groups.data(), out, in, back.data());
      CHECK(back == rows);
      if (in % 64 == 0) CHECK(group_row == row_bytes);
      // Byte by byte from the layout's description (gemv.h), independently of the code's offsets:
      // group G of g rows at 8 G rows' share, pair t at t g 68, row r's values at r 64, then the
      // g rows' scales 4 bytes each; everything else (padding) 0.
      std::vector<int> expect(groups.size(), 0);  // 0: padding; else the rows' byte + 1
      for (int64_t o = 0; o < out; ++o) {
        const int64_t first = o / 8 * 8, g = std::min<int64_t>(8, out - first), r = o - first;
        for (int64_t j = 0; j < in; ++j)
          expect[size_t(first * group_row + (j / 64) * g * 68 + r * 64 + j % 64)] =
              rows[size_t(o * row_bytes + j)] + 1;
        for (int64_t b = 0; b < 2 * cpu::q8_blocks(in); ++b)  // the scales' bytes, 2 a block
          expect[size_t(first * group_row + (b / 4) * g * 68 + g * 64 + r * 4 + b % 4)] =
              rows[size_t(o * row_bytes + in + b)] + 1;
      }
      bool placed = true;
      for (size_t b = 0; b < groups.size(); ++b)
        placed = placed && int(groups[b]) == (expect[b] ? expect[b] - 1 : 0);
      CHECK(placed);
    }
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

TEST_CASE("gemv: Q8_0 problems sharing input rows give the bits of each alone", "[gemv]") {
  // An expert's w1 and w3 share their input rows; a third problem reads the same memory with
  // another stride and row count: one quantisation serves the first two only.
  const Weights a(WeightFormat::q8_0, 40, 64, 1), b(WeightFormat::q8_0, 33, 64, 2),
      c(WeightFormat::q8_0, 20, 32, 3);
  const std::vector<float> x = inputs(2, 64, 6);
  std::vector<float> y(2 * 40 + 2 * 33 + 3 * 20);
  const cpu::GemvProblem p[3] = {{a.matrix(), x.data(), 64, 2, y.data(), 40, 0.0f},
                                 {b.matrix(), x.data(), 64, 2, y.data() + 80, 33, 0.0f},
                                 {c.matrix(), x.data(), 32, 3, y.data() + 146, 20, 0.0f}};
  cpu::gemv_batch(p, 3);
  CHECK(same_bits(std::vector<float>(y.begin(), y.begin() + 80), run(a.matrix(), x, 2)));
  CHECK(same_bits(std::vector<float>(y.begin() + 80, y.begin() + 146), run(b.matrix(), x, 2)));
  CHECK(same_bits(std::vector<float>(y.begin() + 146, y.end()), run(c.matrix(), x, 3)));
}

TEST_CASE(
    "q8_0 inputs: ggml's f16 scales, within their rounding of x, zero blocks exact, "
    "non-finite gives NaN",
    "[gemv]") {
  for (int64_t n : {1, 31, 32, 33, 100}) {
    CAPTURE(n);
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) x[size_t(j)] = rng_normal(19, uint64_t(j)) * 5.0f;
    if (n >= 64)
      for (int64_t j = 32; j < 64; ++j) x[size_t(j)] = 0.0f;
    std::vector<int8_t> q(static_cast<size_t>(n));
    std::vector<float> s(static_cast<size_t>(cpu::q8_blocks(n)));
    cpu::quantize_q8_input_row(x.data(), n, q.data(), s.data());
    for (int64_t b = 0; b < cpu::q8_blocks(n); ++b) {  // the scale is max|x| / 127 in f16
      float amax = 0;
      for (int64_t j = b * 32; j < std::min(n, b * 32 + 32); ++j)
        amax = std::max(amax, std::fabs(x[size_t(j)]));
      REQUIRE(s[size_t(b)] == kernels::f16_to_f32(kernels::f32_to_f16(amax / 127.0f)));
    }
    for (int64_t j = 0; j < n; ++j) {
      const float scale = s[size_t(j / cpu::kQ8Block)];
      REQUIRE(std::fabs(double(x[size_t(j)]) - double(scale) * q[size_t(j)]) <=
              input_moved(x.data(), n, j, s.data()));
      REQUIRE(q[size_t(j)] >= -127);
      if (x[size_t(j)] == 0.0f) REQUIRE(q[size_t(j)] == 0);
    }
    if (n >= 64) CHECK(s[1] == 0.0f);
  }
  // ggml's x86 rule, not x / scale: block max 1 makes the multiplier 127 exactly, and
  // 0x1.62c58ap-5 x 127 rounds to 5.49999.. in f32 (q 5) where x / (1 / 127 in f32) gives 5.5..
  // (q 6); the scale is 1 / 127 in f16 (0x1.02p-7), not in f32 (0x1.020408p-7).
  {
    const float x[2] = {1.0f, 0x1.62c58ap-5f};
    int8_t q[2];
    float s;
    cpu::quantize_q8_input_row(x, 2, q, &s);
    CHECK(q[0] == 127);
    CHECK(q[1] == 5);
    CHECK(s == 0x1.02p-7f);
  }
  // The AVX-512 quantiser the GEMV uses gives the scalar one's bytes and scales: ties (x / s an
  // odd multiple of 0.5: block max 127 makes s = 1), tails, zero and non-finite blocks.
  if (cpu::gemv_isa_supported(cpu::GemvIsa::avx512)) {
    for (int64_t n : {1, 16, 17, 32, 45, 64, 100}) {
      CAPTURE(n);
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j)
        x[size_t(j)] = j % 3 == 0 ? float(j % 40) - 20.5f : rng_normal(23, uint64_t(j)) * 9.0f;
      x[0] = 127.0f;
      if (n > 40) x[40] = std::nanf("");
      if (n >= 96)
        for (int64_t j = 64; j < 96; ++j) x[size_t(j)] = 0.0f;
      const size_t blocks = static_cast<size_t>(cpu::q8_blocks(n));
      std::vector<int8_t> q1(x.size(), 9), q2(x.size(), 7);
      std::vector<float> s1(blocks, 1.0f), s2(blocks, 2.0f);
      cpu::gemv_detail::quantize_input_row(x.data(), n, q1.data(), s1.data(), false);
      cpu::gemv_detail::quantize_input_row(x.data(), n, q2.data(), s2.data(), true);
      CHECK(q1 == q2);
      CHECK(std::memcmp(s1.data(), s2.data(), blocks * sizeof(float)) == 0);
      CHECK(s1[0] == 1.0f);
      if (n > 3) CHECK(q1[3] == -18);  // 3 - 20.5 = -17.5: to even
    }
  }
  // A NaN or an infinity in an input row: that row's outputs are NaN, the other row's are not.
  const Weights w(WeightFormat::q8_0, 5, 70, 8);
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = inputs(2, 70, 9);
    x[70 + 40] = bad;
    const std::vector<float> y = run(w.matrix(), x, 2);
    for (int64_t o = 0; o < 5; ++o) {
      CHECK(std::isfinite(y[size_t(o)]));
      CHECK(std::isnan(y[size_t(5 + o)]));
    }
  }
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
            float one[128];  // and the same from the row as a file holds it
            cpu::dequantize_q8_0_row(row, in, one);
            exact = exact && std::memcmp(&expect, &one[j], sizeof(float)) == 0;
          }
          exact = exact && std::memcmp(&expect, &got[at], sizeof(float)) == 0;
        }
      INFO(cpu::weight_format_name(f) << ", in " << in);
      CHECK(exact);
    }
  }
}
