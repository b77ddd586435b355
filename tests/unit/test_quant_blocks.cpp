// llama.cpp's block formats (backend/cpu/quant_blocks.h): quantised bytes and dequantised floats
// equal to llama.cpp's own (golden files from tests/data/quant_golden/, made by its ggml), dot
// products bitwise equal to a plain integer reference and within a derived bound of the double
// product of the dequantised rows, round trips within each format's grid, and refusals of bad
// sizes, non-finite values and values beyond the formats' f16 scales.
// Shapes: a row of n values in blocks of B (256 for q4_k, q6_k, q8_k; 32 for mxfp4, q8_0).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/quant_blocks.h"
#include "kernels/convert.h"
#include "moe/error.h"
#include "moe/rng.h"

using namespace moe;
using cpu::BlockFormat;

namespace {

const BlockFormat kAll[] = {BlockFormat::q4_k, BlockFormat::q6_k, BlockFormat::mxfp4,
                            BlockFormat::q8_k, BlockFormat::q8_0};
const BlockFormat kWeights[] = {BlockFormat::q4_k, BlockFormat::q6_k, BlockFormat::mxfp4};
constexpr int64_t kGoldenRows = 3, kGoldenCols = 1024;  // make_golden.c's kRows, kCols
constexpr double kU = 1.0 / (1 << 24);                  // f32's unit roundoff

std::vector<uint8_t> read_golden(const std::string& name) {
  const std::string path = std::string(MOE_TEST_DATA_DIR) + "/quant_golden/" + name;
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
std::vector<float> read_golden_f32(const std::string& name, size_t count) {
  const std::vector<uint8_t> bytes = read_golden(name);
  REQUIRE(bytes.size() == count * 4);
  std::vector<float> v(count);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}
std::vector<float> golden_input() {
  return read_golden_f32("input.f32", static_cast<size_t>(kGoldenRows * kGoldenCols));
}

std::vector<uint8_t> quantize(BlockFormat f, const float* x, int64_t n) {
  std::vector<uint8_t> q(static_cast<size_t>(cpu::block_row_bytes(f, n)));
  cpu::quantize_row(f, x, n, q.data());
  return q;
}
std::vector<float> dequantize(BlockFormat f, const uint8_t* q, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  cpu::dequantize_row(f, q, n, y.data());
  return y;
}

// Normal values whose spread changes from block to block (as a layer's rows do), seed fixed.
std::vector<float> random_row(int64_t n, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[static_cast<size_t>(i)] =
        rng_normal(seed, static_cast<uint64_t>(i)) *
        (0.02f + 0.3f * rng_uniform(seed + 1, static_cast<uint64_t>(i / 32)));
  return x;
}

float f16_at(const uint8_t* p) {
  return kernels::f16_to_f32(static_cast<uint16_t>(p[0] | p[1] << 8));
}
float f32_at(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- the plain integer reference of the dot products -------------------------------------------

// Value i of a weight block as integers: value = step * level - offset, written out from the
// byte layouts in quant_blocks.h one value at a time (no shared code with the library).
struct Level {
  int64_t scale, level, min;  // q4_k: sc, q, m; q6_k: scales, q - 32, 0; mxfp4: 1, 2*E2M1, 0
};
Level weight_level(BlockFormat f, const uint8_t* blk, int i) {
  if (f == BlockFormat::mxfp4) {
    static const int kE2M1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    const uint8_t byte = blk[1 + i % 16];
    return {1, kE2M1x2[i < 16 ? byte & 15 : byte >> 4], 0};
  }
  if (f == BlockFormat::q6_k) {
    const int h = i / 128, k = i % 128 / 32, l = i % 32;
    const int low = blk[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2)) & 15;
    const int high = blk[128 + 32 * h + l] >> (2 * k) & 3;
    return {static_cast<int8_t>(blk[192 + i / 16]), low + 16 * high - 32, 0};
  }
  const uint8_t* s = blk + 4;
  const int j = i / 32;
  const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) + 16 * (s[j - 4] >> 6);
  const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) + 16 * (s[j] >> 6);
  const uint8_t byte = blk[16 + 32 * (i / 64) + i % 32];
  return {sc, i % 64 < 32 ? byte & 15 : byte >> 4, m};
}

// One block's exact sums: the dot is (d * d8) * S - (dmin * d8) * M in f32; A and B bound |S|
// and |M| term by term (sum |scale level a|, sum |min a|), in units of d d8 and dmin d8.
struct BlockSums {
  int64_t S = 0, M = 0, A = 0, B = 0;
  double d = 0, dmin = 0, d8 = 0;  // weight scale (mxfp4: 2^(e - 128)), min scale, activation
};
BlockSums block_sums(BlockFormat f, const uint8_t* w, const uint8_t* a) {
  BlockSums s;
  const bool k_quant = f != BlockFormat::mxfp4;
  const int B = k_quant ? 256 : 32;
  for (int i = 0; i < B; ++i) {
    const Level l = weight_level(f, w, i);
    const int64_t q8 = static_cast<int8_t>(a[(k_quant ? 4 : 2) + i]);
    s.S += l.scale * l.level * q8;
    s.M += l.min * q8;
    s.A += std::abs(l.scale * l.level * q8);
    s.B += std::abs(l.min * q8);
  }
  s.d8 = k_quant ? f32_at(a) : f16_at(a);
  s.d = f == BlockFormat::q4_k   ? f16_at(w)
        : f == BlockFormat::q6_k ? f16_at(w + 208)
                                 : std::ldexp(1.0, w[0] - 128);
  s.dmin = f == BlockFormat::q4_k ? f16_at(w + 2) : 0.0;
  return s;
}
std::vector<BlockSums> row_sums(BlockFormat f, const uint8_t* w, const uint8_t* a, int64_t n) {
  const BlockFormat act = cpu::dot_partner(f);
  std::vector<BlockSums> sums;
  for (int64_t b = 0; b < n / cpu::block_elems(f); ++b)
    sums.push_back(block_sums(f, w + b * cpu::block_bytes(f), a + b * cpu::block_bytes(act)));
  return sums;
}
// The f32 operations of quant_blocks.h on the reference's integer sums.
float reference_dot(const std::vector<BlockSums>& sums) {
  float total = 0;
  for (const BlockSums& s : sums)
    total += (static_cast<float>(s.d) * static_cast<float>(s.d8)) * static_cast<float>(s.S) -
             (static_cast<float>(s.dmin) * static_cast<float>(s.d8)) * static_cast<float>(s.M);
  return total;
}
// Rounding-error bound of any f32 evaluation that rounds each block's two products (3 roundings
// each: the scale product, the integer's conversion, the product), its difference (1) and a
// running sum over the blocks (or over `lanes` lane sums first, then the lanes: ggml's generic
// K-quant dots use 8): gamma_k * sum_b (|d d8| A_b + |dmin d8| B_b), k = 4 + blocks + lanes.
double f32_dot_bound(const std::vector<BlockSums>& sums, int lanes) {
  double mass = 0;
  for (const BlockSums& s : sums)
    mass += std::fabs(s.d * s.d8) * static_cast<double>(s.A) +
            std::fabs(s.dmin * s.d8) * static_cast<double>(s.B);
  const double k = 4.0 + static_cast<double>(sums.size()) + lanes;
  return k * kU / (1 - k * kU) * mass;
}

// ---- the round trips' grids --------------------------------------------------------------------

// The largest error a value may have: its distance to the nearest value of its block's grid (the
// format's representable values given the stored header), plus slack for the f32 rounding of
// the quantiser's division and of the dequantised value (3 u of the magnitudes involved).
// xblock: the block's input values, x = xblock[i].
double grid_distance(BlockFormat f, const uint8_t* blk, const float* xblock, int i) {
  const double x = xblock[i];
  double best = std::numeric_limits<double>::infinity(), mag = 0;
  const auto consider = [&](double v) {
    if (std::fabs(x - v) < best) best = std::fabs(x - v), mag = std::fabs(v);
  };
  switch (f) {
    case BlockFormat::q4_k: {
      const Level l = weight_level(f, blk, i);
      const double step = f16_at(blk) * static_cast<double>(l.scale);
      const double offset = f16_at(blk + 2) * static_cast<double>(l.min);
      for (int q = 0; q < 16; ++q) consider(step * q - offset);
      mag += std::fabs(offset);
      break;
    }
    case BlockFormat::q6_k: {
      const double step =
          f16_at(blk + 208) * static_cast<double>(static_cast<int8_t>(blk[192 + i / 16]));
      for (int q = -32; q < 32; ++q) consider(step * q);
      break;
    }
    case BlockFormat::mxfp4:
      for (int v : {0, 1, 2, 3, 4, 6, 8, 12})
        consider(std::copysign(std::ldexp(v, blk[0] - 128), x));
      break;
    case BlockFormat::q8_k:
      for (int q = -128; q < 128; ++q) consider(f32_at(blk) * static_cast<double>(q));
      break;
    case BlockFormat::q8_0: {
      // Values round against the f32 scale amax / 127 and dequantise with its f16 copy: the
      // nearest value of the f32 grid, moved by at most 127 times the scale's f16 rounding.
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xblock[j]));
      const float d = amax / 127;
      for (int q = -127; q < 128; ++q) consider(d * static_cast<double>(q));
      best += 127 * std::fabs(f16_at(blk) - double(d));
      break;
    }
  }
  return best + 3 * kU * (std::fabs(x) + mag) + 1e-45;
}

}  // namespace

TEST_CASE("quant_blocks: quantize_row gives llama.cpp's bytes", "[quant_blocks]") {
  const std::vector<float> x = golden_input();
  for (BlockFormat f : kAll) {
    INFO(cpu::block_format_name(f));
    const std::vector<uint8_t> want = read_golden(std::string(cpu::block_format_name(f)) + ".bin");
    const int64_t row_bytes = cpu::block_row_bytes(f, kGoldenCols);
    REQUIRE(static_cast<int64_t>(want.size()) == kGoldenRows * row_bytes);
    for (int64_t r = 0; r < kGoldenRows; ++r) {
      const std::vector<uint8_t> got = quantize(f, x.data() + r * kGoldenCols, kGoldenCols);
      const auto mismatch = std::mismatch(got.begin(), got.end(), want.begin() + r * row_bytes);
      const int64_t at = mismatch.first - got.begin();
      INFO("row " << r << ", first different byte " << at << " (block " << at / cpu::block_bytes(f)
                  << ", byte " << at % cpu::block_bytes(f) << ")");
      CHECK(mismatch.first == got.end());
    }
  }
}

TEST_CASE("quant_blocks: dequantize_row gives llama.cpp's floats", "[quant_blocks]") {
  const auto n = static_cast<size_t>(kGoldenRows * kGoldenCols);
  for (BlockFormat f : kAll) {
    INFO(cpu::block_format_name(f));
    const std::string name = cpu::block_format_name(f);
    const std::vector<uint8_t> q = read_golden(name + ".bin");
    const std::vector<float> want = read_golden_f32(name + ".deq.f32", n);
    const std::vector<float> got = dequantize(f, q.data(), kGoldenRows * kGoldenCols);
    CHECK(std::memcmp(got.data(), want.data(), n * 4) == 0);  // bits: -0 and 0 differ
  }
}

TEST_CASE("quant_blocks: dot_row against ggml's vec_dot on the golden rows", "[quant_blocks]") {
  // dots.f32[w][r][s]: ggml's dot of weight row r with activation row s (both from the golden
  // files). ggml's generic mxfp4 x q8_0 does our f32 operations: the same bits. Its K-quant dots
  // sum in 8 lanes: both it and we are within f32_dot_bound (8 lanes) of the exact sum.
  const std::vector<float> want = read_golden_f32("dots.f32", 27);
  for (int w = 0; w < 3; ++w) {
    const BlockFormat f = kWeights[w], act = cpu::dot_partner(f);
    const std::vector<uint8_t> wq = read_golden(std::string(cpu::block_format_name(f)) + ".bin");
    const std::vector<uint8_t> aq = read_golden(std::string(cpu::block_format_name(act)) + ".bin");
    for (int r = 0; r < 3; ++r)
      for (int s = 0; s < 3; ++s) {
        INFO(cpu::block_format_name(f) << " row " << r << " x row " << s);
        const uint8_t* wrow = wq.data() + r * cpu::block_row_bytes(f, kGoldenCols);
        const uint8_t* arow = aq.data() + s * cpu::block_row_bytes(act, kGoldenCols);
        const float got = cpu::dot_row(f, wrow, arow, kGoldenCols), ggml = want[9 * w + 3 * r + s];
        if (f == BlockFormat::mxfp4) {
          CHECK(got == ggml);
        } else {
          const std::vector<BlockSums> sums = row_sums(f, wrow, arow, kGoldenCols);
          CHECK(std::fabs(double(got) - ggml) <= 2 * f32_dot_bound(sums, 8));
        }
      }
  }
}

TEST_CASE("quant_blocks: dot_row is bitwise a plain integer reference", "[quant_blocks]") {
  for (BlockFormat f : kWeights)
    for (int64_t n : {256, 512, 2048}) {
      INFO(cpu::block_format_name(f) << ", n " << n);
      const std::vector<float> x = random_row(n, 11 + n), y = random_row(n, 12 + n);
      const std::vector<uint8_t> w = quantize(f, x.data(), n);
      const std::vector<uint8_t> a = quantize(cpu::dot_partner(f), y.data(), n);
      CHECK(cpu::dot_row(f, w.data(), a.data(), n) ==
            reference_dot(row_sums(f, w.data(), a.data(), n)));
    }
  // Q8_K's bsums are the sums of its values (the K-quant dots use them for the mins).
  const std::vector<float> y = random_row(512, 5);
  const std::vector<uint8_t> a = quantize(BlockFormat::q8_k, y.data(), 512);
  for (int b = 0; b < 2; ++b)
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += static_cast<int8_t>(a[292 * b + 4 + 16 * j + i]);
      int16_t stored;
      std::memcpy(&stored, &a[292 * b + 260 + 2 * j], 2);
      CHECK(stored == sum);
    }
}

TEST_CASE("quant_blocks: dot_row is the dequantised rows' product within its rounding",
          "[quant_blocks]") {
  // The exact dot of the blocks' values is sum_b (d d8 S_b - dmin d8 M_b). dot_row errs from it
  // by at most f32_dot_bound (no lanes); the double product R of the dequantised rows errs by at
  // most 2 u sum |w a| (each dequantised w and a is its exact value rounded once to f32) plus
  // the double sum's n 2^-53 sum |w a|. So |dot_row - R| stays below their sum.
  for (BlockFormat f : kWeights)
    for (int64_t n : {256, 1024, 4096}) {
      INFO(cpu::block_format_name(f) << ", n " << n);
      const BlockFormat act = cpu::dot_partner(f);
      const std::vector<float> x = random_row(n, 21 + n), y = random_row(n, 22 + n);
      const std::vector<uint8_t> w = quantize(f, x.data(), n), a = quantize(act, y.data(), n);
      const std::vector<float> wd = dequantize(f, w.data(), n), ad = dequantize(act, a.data(), n);
      double product = 0, magnitude = 0;
      for (size_t i = 0; i < wd.size(); ++i) {
        product += double(wd[i]) * ad[i];
        magnitude += std::fabs(double(wd[i]) * ad[i]);
      }
      const double bound = f32_dot_bound(row_sums(f, w.data(), a.data(), n), 0) +
                           (2.0001 * kU + static_cast<double>(n) * 0x1p-53) * magnitude;
      const float got = cpu::dot_row(f, w.data(), a.data(), n);
      CHECK(std::fabs(got - product) <= bound);
      CHECK(bound <= 1e-5 * magnitude);  // the bound itself is small: the check means something
    }
}

TEST_CASE("quant_blocks: round trips stay on each block's nearest grid value", "[quant_blocks]") {
  // Every value dequantises to the value of its block's grid nearest to it (grid_distance), on
  // the golden hard cases and on random rows; all of the format's levels are in play.
  std::vector<float> rows = golden_input();
  const std::vector<float> extra = random_row(4096, 31);
  rows.insert(rows.end(), extra.begin(), extra.end());
  const auto n = static_cast<int64_t>(rows.size());
  for (BlockFormat f : kAll) {
    INFO(cpu::block_format_name(f));
    const std::vector<uint8_t> q = quantize(f, rows.data(), n);
    const std::vector<float> y = dequantize(f, q.data(), n);
    int64_t worse = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* blk = q.data() + i / cpu::block_elems(f) * cpu::block_bytes(f);
      const int in_block = static_cast<int>(i % cpu::block_elems(f));
      const auto idx = static_cast<size_t>(i);
      const float* xblock = rows.data() + (i - in_block);
      if (std::fabs(double(y[idx]) - rows[idx]) > grid_distance(f, blk, xblock, in_block)) {
        if (worse++ < 3) UNSCOPED_INFO("value " << i << ": " << rows[idx] << " -> " << y[idx]);
      }
    }
    CHECK(worse == 0);
  }
}

TEST_CASE("quant_blocks: round-trip error of N(0, 1) rows is the formats' step / sqrt(12)",
          "[quant_blocks]") {
  // Rounding to a grid of step s errs uniformly: RMS s / sqrt(12). The steps for N(0, 1) values:
  // q8_0: max of 32 (about 2.1) / 127; q8_k: max of 256 (about 2.9) / 127; q6_k: max of 16
  // (about 1.8) / 32; q4_k: range of 32 (about 4.1) / 15; mxfp4: the E2M1 grid of step 2^(e-127)
  // between 2 and 4 units, where most values fall, its unit a quarter of the block's max (2.1)
  // rounded down to a power of two (0.25..0.5): step about 0.5. Bounds: 1.25 times those.
  const int64_t n = 1 << 14;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[static_cast<size_t>(i)] = rng_normal(41, static_cast<uint64_t>(i));
  const std::pair<BlockFormat, double> steps[] = {{BlockFormat::q8_0, 2.1 / 127},
                                                  {BlockFormat::q8_k, 2.9 / 127},
                                                  {BlockFormat::q6_k, 1.8 / 32},
                                                  {BlockFormat::q4_k, 4.1 / 15},
                                                  {BlockFormat::mxfp4, 0.5}};
  for (const auto& [f, step] : steps) {
    const std::vector<uint8_t> q = quantize(f, x.data(), n);
    const std::vector<float> y = dequantize(f, q.data(), n);
    double squares = 0;
    for (size_t i = 0; i < x.size(); ++i) squares += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    INFO(cpu::block_format_name(f) << ": RMS " << std::sqrt(squares / n));
    CHECK(std::sqrt(squares / n) <= 1.25 * step / std::sqrt(12.0));
  }
}

TEST_CASE("quant_blocks: the cases ggml leaves undefined or unwritten", "[quant_blocks]") {
  // MXFP4 below 2^-125: ggml's exponent byte would be negative; ours is 0 and values round to
  // the nearest of 0 and the smallest units.
  std::vector<float> tiny(32, 0.0f);
  tiny[0] = 1e-40f, tiny[1] = -3e-39f, tiny[5] = 2e-45f;
  const std::vector<uint8_t> m = quantize(BlockFormat::mxfp4, tiny.data(), 32);
  CHECK(m[0] == 0);
  const std::vector<float> back = dequantize(BlockFormat::mxfp4, m.data(), 32);
  for (int i = 0; i < 32; ++i) CHECK(std::fabs(back[i] - tiny[i]) <= 0x1p-129f);
  // An all-zero Q8_K block: d, values and bsums all zero.
  const std::vector<float> zeros(256, 0.0f);
  const std::vector<uint8_t> z = quantize(BlockFormat::q8_k, zeros.data(), 256);
  CHECK(std::all_of(z.begin(), z.end(), [](uint8_t b) { return b == 0; }));
}

TEST_CASE("quant_blocks: bad sizes, non-finite values and overflowing scales are refused",
          "[quant_blocks]") {
  using Catch::Matchers::Contains;
  std::vector<float> x(512, 0.5f);
  std::vector<uint8_t> out(4096);
  CHECK(cpu::block_row_bytes(BlockFormat::q4_k, 512) == 288);
  CHECK(cpu::block_row_bytes(BlockFormat::mxfp4, 64) == 34);
  CHECK_THROWS_WITH(cpu::block_row_bytes(BlockFormat::q6_k, 300),
                    Contains("q6_k") && Contains("300") && Contains("256"));
  CHECK_THROWS_WITH(cpu::quantize_row(BlockFormat::mxfp4, x.data(), 48, out.data()),
                    Contains("mxfp4") && Contains("48") && Contains("32"));
  CHECK_THROWS_WITH(cpu::dequantize_row(BlockFormat::q4_k, out.data(), 128, x.data()),
                    Contains("q4_k") && Contains("128"));
  CHECK_THROWS_WITH(cpu::block_row_bytes(BlockFormat::q8_0, -32), Contains("-32"));
  CHECK_THROWS_WITH(cpu::dot_row(BlockFormat::q4_k, out.data(), out.data(), 100),
                    Contains("q4_k") && Contains("100"));
  CHECK_THROWS_WITH(cpu::dot_partner(BlockFormat::q8_k), Contains("q8_k"));
  for (BlockFormat f : kAll)
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()}) {
      std::vector<float> v(256, 0.25f);
      v[77] = bad;
      CHECK_THROWS_WITH(
          cpu::quantize_row(f, v.data(), 256, out.data()),
          Contains(cpu::block_format_name(f)) && Contains("value 77") && Contains("not finite"));
    }
  // Largest magnitudes whose f16 scale would be infinite (the limits in quant_blocks.h).
  const std::pair<BlockFormat, float> too_large[] = {
      {BlockFormat::q4_k, -5e6f}, {BlockFormat::q6_k, 4e8f}, {BlockFormat::q8_0, 8.4e6f}};
  for (const auto& [f, big] : too_large) {
    std::vector<float> v(512, 1.0f);
    v[300] = big;
    const std::string block = "block " + std::to_string(300 / cpu::block_elems(f)) + " ";
    CHECK_THROWS_WITH(cpu::quantize_row(f, v.data(), 512, out.data()),
                      Contains(cpu::block_format_name(f)) && Contains(block) && Contains("65504"));
  }
}
