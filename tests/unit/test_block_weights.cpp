// Inference over weights in llama.cpp's block formats (q4_k, q6_k, mxfp4 rows, GGUF's bytes; see
// backend/cpu/gemv.h and infer/model.cpp). Op level: a product of at most 8 rows gives, bit for
// bit, cpu::dot_row of each weight row and the input row quantised to the format's partner (the
// same bits at 1 and 2 threads), within dot_row's derived rounding of the double product of the
// dequantised rows, and within the partner's rounding of the inputs of the f32 product; larger
// products give the bits of the f32 weights they dequantise to. Model level: a checkpoint whose
// matrices are block rows (written here with cpu::quantize_row, as the storage contract lays
// them out) scores as the f32 model of its dequantised weights: bit for bit on the tiled sgemm
// path, within the 8-bit inputs' rounding with the GEMV; decode and full-sequence scoring agree;
// damaged scales, rows of the wrong size and misused tensors are refused by name.
// Shapes: m input rows, out x in weights; the model: mixtral, d 256, F 512, 4 experts top-2, 2
// layers, vocabulary 256 (every matrix's `in` a whole number of 256-blocks).
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/gemv.h"
#include "backend/cpu/gemv_blocks.h"
#include "backend/cpu/quant_blocks.h"
#include "kernels/convert.h"
#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "moe/io/convert.h"
#include "moe/models/transformer.h"
#include "moe/ops/core.h"
#include "moe/ops/moe.h"
#include "moe/rng.h"
#include "moe/threads.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;
using cpu::BlockFormat;

namespace {

const BlockFormat kWeights[] = {BlockFormat::q4_k, BlockFormat::q6_k, BlockFormat::mxfp4};

std::vector<float> normals(int64_t n, uint64_t seed, float scale, float shift = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  const uint64_t key = rng_key(seed, {0xb10c});
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = shift + scale * rng_normal(key, static_cast<uint64_t>(i));
  return v;
}

// A weight matrix [out, in] as block rows and as the f32 values they dequantise to.
struct BlockMatrix {
  BlockFormat format;
  int64_t out, in, row_bytes;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // dequantised [out, in]

  BlockMatrix(BlockFormat f, int64_t o, int64_t i, uint64_t seed)
      : format(f), out(o), in(i), row_bytes(cpu::block_row_bytes(f, i)) {
    // A shift, so that q4_k's block minimums matter.
    const std::vector<float> x = normals(out * in, seed, 0.1f, 0.02f);
    bytes.resize(static_cast<size_t>(out * row_bytes));
    values.resize(static_cast<size_t>(out * in));
    for (int64_t r = 0; r < out; ++r) {
      cpu::quantize_row(f, x.data() + r * in, in, bytes.data() + r * row_bytes);
      cpu::dequantize_row(f, bytes.data() + r * row_bytes, in, values.data() + r * in);
    }
  }
  cpu::WeightMatrix matrix() const {
    const cpu::WeightFormat wf = format == BlockFormat::q4_k   ? cpu::WeightFormat::q4_k
                                 : format == BlockFormat::q6_k ? cpu::WeightFormat::q6_k
                                                               : cpu::WeightFormat::mxfp4;
    return {wf, bytes.data(), out, in};
  }
  Tensor rows() const {  // the u8 rows, as a file holds them
    Tensor t = Tensor::empty({out, row_bytes}, DType::u8);
    std::memcpy(t.raw(), bytes.data(), bytes.size());
    return t;
  }
  Tensor f32() const { return Tensor::from_vector({out, in}, values); }
};

// What the GEMV promises: dot_row of the weight row and the input row in the partner format.
std::vector<float> expected_gemv(const BlockMatrix& w, const float* x, int64_t ldx, int64_t m) {
  const BlockFormat partner = cpu::dot_partner(w.format);
  std::vector<uint8_t> a(static_cast<size_t>(cpu::block_row_bytes(partner, w.in)));
  std::vector<float> y(static_cast<size_t>(m * w.out));
  for (int64_t i = 0; i < m; ++i) {
    cpu::quantize_row(partner, x + i * ldx, w.in, a.data());
    for (int64_t o = 0; o < w.out; ++o)
      y[static_cast<size_t>(i * w.out + o)] =
          cpu::dot_row(w.format, w.bytes.data() + o * w.row_bytes, a.data(), w.in);
  }
  return y;
}

std::vector<float> gemv(const BlockMatrix& w, const std::vector<float>& x, int64_t ldx, int64_t m,
                        std::vector<float> y = {}, float beta = 0) {
  if (y.empty()) y.assign(static_cast<size_t>(m * w.out), 0.0f);
  const cpu::GemvProblem p{w.matrix(), x.data(), ldx, m, y.data(), w.out, beta};
  cpu::gemv_batch(&p, 1);
  return y;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> values_of(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

}  // namespace

TEST_CASE("block weights: the GEMV's dot products are dot_row's bits on any bytes",
          "[block_weights]") {
  // Random bytes reach every level, scale, min and bsum the formats hold (q8 values -128 too);
  // only the scales are set, to finite values (of either sign for the f16 and f32 ones) whose
  // products stay finite.
  const uint64_t key = rng_key(3, {0xd07});
  uint64_t index = 0;
  auto byte = [&] { return static_cast<uint8_t>(rng_below(key, index++, 256)); };
  auto put_f16 = [&](uint8_t* at) {
    const uint16_t h = kernels::f32_to_f16(rng_normal(key, index++));
    std::memcpy(at, &h, 2);
  };
  for (BlockFormat f : kWeights) {
    INFO(cpu::block_format_name(f));
    const BlockFormat partner = cpu::dot_partner(f);
    const int64_t n = 4 * cpu::block_elems(f);
    int64_t differ = 0;
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<uint8_t> w(static_cast<size_t>(cpu::block_row_bytes(f, n)));
      std::vector<uint8_t> a(static_cast<size_t>(cpu::block_row_bytes(partner, n)));
      for (uint8_t& b : w) b = byte();
      for (uint8_t& b : a) b = byte();
      for (int64_t b = 0; b < 4; ++b) {
        uint8_t* wb = w.data() + b * cpu::block_bytes(f);
        uint8_t* ab = a.data() + b * cpu::block_bytes(partner);
        if (f == BlockFormat::q4_k) put_f16(wb), put_f16(wb + 2);
        if (f == BlockFormat::q6_k) put_f16(wb + 208);
        if (f == BlockFormat::mxfp4) wb[0] = static_cast<uint8_t>(100 + byte() % 55);  // 2^+-27
        if (partner == BlockFormat::q8_k) {
          const float d = rng_normal(key, index++);
          std::memcpy(ab, &d, 4);
        } else {
          put_f16(ab);
        }
      }
      const float want = cpu::dot_row(f, w.data(), a.data(), n);
      const float got = cpu::gemv_detail::dot_block_row(f, w.data(), a.data(), n);
      differ += std::memcmp(&want, &got, sizeof got) != 0;
      REQUIRE(std::isfinite(want));
    }
    CHECK(differ == 0);
  }
}

// The x86 copies of dot_block_row (gemv_blocks_simd.h) and the GEMV paths that run them. A copy
// this CPU lacks is reported as skipped (a warning naming it), not run.
struct BlockCopy {
  cpu::GemvIsa isa;
  const char* name;
};
const BlockCopy kCopies[] = {{cpu::GemvIsa::avx2, "avx2"},
                             {cpu::GemvIsa::avx512, "avx512"},
                             {cpu::GemvIsa::avx512_vnni, "avx512_vnni"}};

bool copy_runs(const BlockCopy& c) {
  if (cpu::gemv_isa_supported(c.isa)) return true;
  WARN("skipped: this CPU lacks " << c.name << ", its block-format copy is not compared");
  return false;
}

TEST_CASE("block weights: every x86 copy of the dot products gives the scalar body's bits",
          "[block_weights]") {
  // Random bytes reach every level, scale, min and bsum (q8 values -128 too, which an int8 sign
  // trick would get wrong); scales are random, extreme (f16's largest and smallest subnormal, 0,
  // either sign; q8_k's f32 up to 1e30 and down to 1e-38, where products overflow or underflow:
  // the bits still agree) or whole blocks are zero; rows of 1, 2, 3 and 7 blocks.
  const uint64_t key = rng_key(4, {0x51d});
  uint64_t index = 0;
  auto byte = [&] { return static_cast<uint8_t>(rng_below(key, index++, 256)); };
  const float f16_extremes[] = {65504.0f, -65504.0f, 5.9604645e-8f, -5.9604645e-8f, 0.0f, 1.0f};
  const float f32_extremes[] = {1e30f, -1e30f, 1e-38f, 0.0f, -3.0f, 1.0f};
  auto put_f16 = [&](uint8_t* at, int kind) {
    const float v = kind == 0 ? rng_normal(key, index++) : f16_extremes[byte() % 6];
    const uint16_t h = kernels::f32_to_f16(v);
    std::memcpy(at, &h, 2);
  };
  for (const BlockCopy& copy : kCopies) {
    if (!copy_runs(copy)) continue;
    const cpu::gemv_detail::DotBlockRow dot = cpu::gemv_detail::dot_block_row_for(copy.isa);
    for (BlockFormat f : kWeights) {
      INFO(copy.name << " " << cpu::block_format_name(f));
      const BlockFormat partner = cpu::dot_partner(f);
      int64_t differ = 0, nonzero = 0;
      for (int trial = 0; trial < 400; ++trial) {
        const int64_t blocks = std::array<int64_t, 4>{1, 2, 3, 7}[trial % 4];
        const int64_t n = blocks * cpu::block_elems(f);
        const int kind = trial / 4 % 3;  // 0: random scales, 1: extreme ones, 2: some zero blocks
        std::vector<uint8_t> w(static_cast<size_t>(cpu::block_row_bytes(f, n)));
        std::vector<uint8_t> a(static_cast<size_t>(cpu::block_row_bytes(partner, n)));
        for (uint8_t& b : w) b = byte();
        for (uint8_t& b : a) b = byte();
        for (int64_t b = 0; b < blocks; ++b) {
          uint8_t* wb = w.data() + b * cpu::block_bytes(f);
          uint8_t* ab = a.data() + b * cpu::block_bytes(partner);
          if (f == BlockFormat::q4_k) put_f16(wb, kind), put_f16(wb + 2, kind);
          if (f == BlockFormat::q6_k) put_f16(wb + 208, kind);
          if (f == BlockFormat::mxfp4) wb[0] = kind == 1 ? byte() : uint8_t(100 + byte() % 55);
          if (partner == BlockFormat::q8_k) {
            const float d = kind == 1 ? f32_extremes[byte() % 6] : rng_normal(key, index++);
            std::memcpy(ab, &d, 4);
          } else {
            put_f16(ab, kind);
          }
          if (kind == 2 && byte() % 2) std::fill(wb, wb + cpu::block_bytes(f), uint8_t{0});
          if (kind == 2 && byte() % 2) std::fill(ab, ab + cpu::block_bytes(partner), uint8_t{0});
        }
        const float want = cpu::gemv_detail::dot_block_row(f, w.data(), a.data(), n);
        const float got = dot(f, w.data(), a.data(), n);
        differ += std::memcmp(&want, &got, sizeof got) != 0;
        nonzero += want != 0;
      }
      CHECK(differ == 0);
      CHECK(nonzero > 200);  // most products are not zero: the comparison means something
    }
  }
}

TEST_CASE("block weights: every GEMV path gives the scalar path's bits at 1 and 2 threads",
          "[block_weights]") {
  const int before = num_threads();
  for (BlockFormat f : kWeights) {
    // 44 output rows (tasks of 16, the last short), rows of 3 blocks of 256 (24 of 32): 44 x 768
    // is above kParallelWork even for m = 1, so 2 threads split the rows.
    const BlockMatrix w(f, 44, 768, 11);
    for (int64_t m : {1, 2, 5}) {
      const std::vector<float> x = normals(m * w.in, 300 + m, 1.0f);
      std::vector<float> want(static_cast<size_t>(m * w.out));
      const cpu::GemvProblem scalar{w.matrix(), x.data(), w.in, m, want.data(), w.out, 0.0f};
      set_num_threads(1);
      cpu::gemv_batch(&scalar, 1, cpu::GemvIsa::scalar);
      for (const BlockCopy& copy : kCopies) {
        if (!copy_runs(copy)) continue;
        for (int threads : {1, 2}) {
          INFO(cpu::block_format_name(f)
               << " m " << m << " " << copy.name << " threads " << threads);
          set_num_threads(threads);
          std::vector<float> got(want.size(), -1.0f);
          const cpu::GemvProblem p{w.matrix(), x.data(), w.in, m, got.data(), w.out, 0.0f};
          cpu::gemv_batch(&p, 1, copy.isa);
          CHECK(same_bits(got, want));
        }
      }
    }
  }
  set_num_threads(before);
}

TEST_CASE("block weights: the GEMV is dot_row against the partner-quantised inputs",
          "[block_weights]") {
  for (BlockFormat f : kWeights) {
    INFO(cpu::block_format_name(f));
    // 100 output rows: several tasks of 16, the last one short; rows 512 wide: 2 blocks of 256,
    // 16 of 32; ldx wider than the row.
    const BlockMatrix w(f, 100, 512, 7);
    const BlockFormat partner = cpu::dot_partner(f);
    const int64_t in = w.in, ldx = in + 5, block = cpu::block_elems(partner);
    for (int64_t m : {1, 3, 8}) {
      INFO("m " << m);
      const std::vector<float> x = normals(m * ldx, 100 + m, 1.0f);
      set_num_threads(1);
      const std::vector<float> one = gemv(w, x, ldx, m);
      set_num_threads(2);
      const std::vector<float> two = gemv(w, x, ldx, m);
      const std::vector<float> want = expected_gemv(w, x.data(), ldx, m);
      CHECK(same_bits(one, want));
      CHECK(same_bits(two, want));
      // beta: y = dot + beta y, as every GEMV path stores it.
      std::vector<float> y0 = normals(m * w.out, 200 + m, 1.0f), with_beta = want;
      for (size_t i = 0; i < with_beta.size(); ++i) with_beta[i] = want[i] + 0.5f * y0[i];
      CHECK(same_bits(gemv(w, x, ldx, m, y0, 0.5f), with_beta));

      // Against the double product of the dequantised rows: dot_row's own rounding, at most
      // 1e-5 of sum |w a| (test_quant_blocks derives it). Against the f32 inputs: each input is
      // rounded by at most half its block's step, max|x| / 254 (x 1.001: q8_0's f16 step), so
      // the product moves by at most sum over blocks of that times sum |w| over the block.
      std::vector<uint8_t> a(static_cast<size_t>(cpu::block_row_bytes(partner, in)));
      std::vector<float> ad(static_cast<size_t>(in));
      double worst_input_rounding = 0;
      for (int64_t i = 0; i < m; ++i) {
        const float* xi = x.data() + i * ldx;
        cpu::quantize_row(partner, xi, in, a.data());
        cpu::dequantize_row(partner, a.data(), in, ad.data());
        for (int64_t o = 0; o < w.out; ++o) {
          const float* wr = w.values.data() + o * in;
          double exact = 0, magnitude = 0, f32_exact = 0, f32_magnitude = 0, input_bound = 0;
          for (int64_t b = 0; b < in / block; ++b) {
            double amax = 0, wsum = 0;
            for (int64_t j = b * block; j < (b + 1) * block; ++j) {
              exact += double(wr[j]) * ad[j];
              magnitude += std::fabs(double(wr[j]) * ad[j]);
              f32_exact += double(wr[j]) * xi[j];
              f32_magnitude += std::fabs(double(wr[j]) * xi[j]);
              amax = std::max(amax, std::fabs(double(xi[j])));
              wsum += std::fabs(double(wr[j]));
            }
            input_bound += 1.001 * amax / 254 * wsum;
          }
          const double got = want[static_cast<size_t>(i * w.out + o)];
          CHECK(std::fabs(got - exact) <= 1e-5 * magnitude);
          CHECK(std::fabs(got - f32_exact) <= input_bound + 1e-5 * f32_magnitude);
          worst_input_rounding = std::max(worst_input_rounding, std::fabs(got - f32_exact));
        }
      }
      CHECK(worst_input_rounding > 0);  // the inputs were rounded: the checks above mean something
    }
  }
}

TEST_CASE("block weights: gemm and grouped_gemm take them as x W^T", "[block_weights]") {
  for (BlockFormat f : kWeights) {
    INFO(cpu::block_format_name(f));
    const BlockMatrix w(f, 40, 256, 3);
    const Tensor blocks = cpu::block_rows(w.rows(), f);
    CHECK(blocks.dtype() == cpu::dtype_of_block_format(f));
    CHECK(blocks.shape() == Shape{w.out, w.row_bytes});
    const Tensor wf = w.f32();
    // 20 rows: the weights widen exactly and run the tiled sgemm, so the product is the f32
    // weights' bit for bit; 3 rows: the GEMV.
    for (int64_t m : {20, 3}) {
      INFO("m " << m);
      const Tensor x = Tensor::from_vector({m, w.in}, normals(m * w.in, 9, 1.0f));
      Tensor y = Tensor::zeros({m, w.out}), y32 = Tensor::zeros({m, w.out});
      ops::gemm(x, false, blocks, true, y);
      ops::gemm(x, false, wf, true, y32);
      if (m > cpu::kGemvMaxRows)
        CHECK(same_bits(values_of(y), values_of(y32)));
      else
        CHECK(same_bits(values_of(y), expected_gemv(w, x.data<float>(), w.in, m)));
    }
    // Experts [3, out, row bytes]: expert 0 takes 2 rows (the GEMV), expert 1 none, expert 2 13
    // (the sgemm).
    const BlockMatrix w0(f, 40, 256, 11), w2(f, 40, 256, 12);
    Tensor experts = Tensor::empty({3, w.out, w.row_bytes}, cpu::dtype_of_block_format(f));
    Tensor experts32 = Tensor::empty({3, w.out, w.in});
    const BlockMatrix* each[] = {&w0, &w, &w2};
    for (int e = 0; e < 3; ++e) {
      std::memcpy(static_cast<uint8_t*>(experts.raw()) + e * w.out * w.row_bytes,
                  each[e]->bytes.data(), each[e]->bytes.size());
      std::memcpy(experts32.data<float>() + e * w.out * w.in, each[e]->values.data(),
                  each[e]->values.size() * sizeof(float));
    }
    const std::vector<int32_t> offsets = {0, 2, 2, 15};
    const Tensor x = Tensor::from_vector({15, w.in}, normals(15 * w.in, 13, 1.0f));
    Tensor y = Tensor::zeros({15, w.out}), y32 = Tensor::zeros({15, w.out});
    ops::grouped_gemm(x, experts, true, offsets, y);
    ops::grouped_gemm(x, experts32, true, offsets, y32);
    const std::vector<float> got = values_of(y), f32 = values_of(y32);
    const size_t first = static_cast<size_t>(2 * w.out);
    CHECK(std::equal(got.begin() + first, got.end(), f32.begin() + first));  // bits: the sgemm
    CHECK(same_bits(std::vector<float>(got.begin(), got.begin() + first),
                    expected_gemv(w0, x.data<float>(), w.in, 2)));

    // A row holding a NaN gives NaN products; the other rows are unaffected.
    std::vector<float> xs = normals(2 * w.in, 17, 1.0f);
    xs[static_cast<size_t>(w.in + 5)] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> yn = gemv(w, xs, w.in, 2);
    const std::vector<float> clean = expected_gemv(w, xs.data(), w.in, 1);
    CHECK(std::equal(clean.begin(), clean.end(), yn.begin()));
    for (int64_t o = 0; o < w.out; ++o) CHECK(std::isnan(yn[static_cast<size_t>(w.out + o)]));

    // Misuse: the file's u8 rows unconverted, and rows of another width, are refused by name.
    Tensor out = Tensor::zeros({3, w.out});
    const Tensor x3 = Tensor::zeros({3, w.in}), x512 = Tensor::zeros({3, 512});
    CHECK(test::error_of([&] { ops::gemm(x3, false, w.rows(), true, out); }).find("block_rows") !=
          std::string::npos);
    CHECK(test::error_of([&] {
            ops::gemm(x512, false, blocks, true, out);
          }).find("shapes do not chain") != std::string::npos);
    CHECK(test::error_of([&] {
            cpu::block_rows(w.rows(), BlockFormat::q8_k);
          }).find("activation format") != std::string::npos);
  }
}

namespace {

ModelConfig block_model_config() {
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.d_model = 256;
  c.d_ff = 512;
  c.vocab_size = 256;
  c.resolve();
  return c;
}

// A fresh model's parameters plus noise, so the logits spread (a fresh model's are near 0).
io::Checkpoint noisy_checkpoint(const ModelConfig& c, uint64_t seed) {
  io::Checkpoint ckpt = test::initial_checkpoint(c, seed);
  uint64_t index = 0;
  const uint64_t key = rng_key(seed, {0x401});
  for (io::NamedTensor& nt : ckpt.params) {
    float* d = nt.tensor.data<float>();
    for (int64_t i = 0; i < nt.tensor.numel(); ++i) d[i] += 0.05f * rng_normal(key, index++);
  }
  return ckpt;
}

// The storage contract: each block-quantised weight [.., out, in] a u8 tensor [.., out,
// block_row_bytes(format, in)] of block rows, named in model_config tensor_formats; and the same
// checkpoint with those weights replaced by their dequantised f32 values (the twin).
struct Quantised {
  io::Checkpoint blocks, twin;
  int64_t tensors = 0;
};
Quantised quantise(const io::Checkpoint& in, const std::string& recipe,
                   const std::function<BlockFormat(int64_t)>& format_of_tensor) {
  Quantised q{in, in, 0};
  q.blocks.model_config[io::kQuantizationKey] = recipe;
  q.blocks.model_config[io::kTensorFormatsKey] = nlohmann::json::object();
  for (size_t t = 0; t < in.params.size(); ++t) {
    const io::NamedTensor& nt = in.params[t];
    if (!io::quantizable(nt.name, nt.tensor.shape())) continue;
    const BlockFormat f = format_of_tensor(q.tensors++);
    const int64_t width = nt.tensor.shape().back(), rows = nt.tensor.numel() / width;
    REQUIRE(width % cpu::block_elems(f) == 0);
    const int64_t row_bytes = cpu::block_row_bytes(f, width);
    Shape shape = nt.tensor.shape();
    shape.back() = row_bytes;
    Tensor bytes = Tensor::empty(shape, DType::u8), values = Tensor::empty(nt.tensor.shape());
    for (int64_t r = 0; r < rows; ++r) {
      cpu::quantize_row(f, nt.tensor.data<float>() + r * width, width,
                        bytes.data<uint8_t>() + r * row_bytes);
      cpu::dequantize_row(f, bytes.data<uint8_t>() + r * row_bytes, width,
                          values.data<float>() + r * width);
    }
    q.blocks.params[t].tensor = bytes;
    q.twin.params[t].tensor = values;
    q.blocks.model_config[io::kTensorFormatsKey][nt.name] = cpu::block_format_name(f);
  }
  return q;
}

// The prompt and the tokens fed after it.
const std::vector<int32_t> kPrompt = {3, 32, 61, 90, 119, 148, 177, 206, 235, 8, 37, 66};
const std::vector<int32_t> kFed = {5, 12, 19};

// Logits of a 12-token prefill (its attention projections and LM head take the tiled sgemm; its
// expert segments, 6 rows on average, the GEMV), then of 3 decode steps (all GEMV), concatenated.
std::vector<float> decode(const Transformer& model) {
  KVCache cache = model.make_cache(1);
  Tensor logits = model.forward_cached(
      Tensor::from_vector({1, static_cast<int64_t>(kPrompt.size())}, kPrompt), cache);
  std::vector<float> out = values_of(logits);
  for (int32_t token : kFed) {
    logits = model.forward_cached(Tensor::from_vector({1, 1}, std::vector<int32_t>{token}), cache);
    const std::vector<float> l = values_of(logits);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

// The same positions' logits from one full forward pass over the whole sequence (scoring).
std::vector<float> score(const Transformer& model) {
  std::vector<int32_t> ids = kPrompt;
  ids.insert(ids.end(), kFed.begin(), kFed.end());
  const int64_t t = static_cast<int64_t>(ids.size()), v = model.config().vocab_size;
  const std::vector<float> all = values_of(model.logits(Tensor::from_vector({1, t}, ids)));
  return std::vector<float>(all.begin() + (t - 1 - static_cast<int64_t>(kFed.size())) * v,
                            all.end());
}

// max |a - b| and max |b|.
std::pair<double, double> difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return {worst, scale};
}

}  // namespace

TEST_CASE("block weights: a block-quantised checkpoint scores as its dequantised weights",
          "[block_weights]") {
  test::ScratchDir dir("block-weights");
  const ModelConfig config = block_model_config();
  const io::Checkpoint ckpt = noisy_checkpoint(config, 5);
  struct Recipe {
    std::string name;
    std::function<BlockFormat(int64_t)> format;
  };
  const Recipe recipes[] = {
      {"q4_k", [](int64_t) { return BlockFormat::q4_k; }},
      {"q6_k", [](int64_t) { return BlockFormat::q6_k; }},
      {"mxfp4", [](int64_t) { return BlockFormat::mxfp4; }},
      // Every format in one model, tensor after tensor (the recipe name only labels the mix).
      {"q4_k_m", [](int64_t t) { return kWeights[t % 3]; }},
  };
  for (const Recipe& recipe : recipes) {
    INFO(recipe.name);
    const Quantised q = quantise(ckpt, recipe.name, recipe.format);
    CHECK(q.tensors == 15);  // 4 attention matrices and 3 expert tensors a layer, the LM head
    io::save_checkpoint(dir / (recipe.name + ".h5"), q.blocks);
    io::save_checkpoint(dir / (recipe.name + "-twin.h5"), q.twin);
    infer::LoadedModel m = infer::load_model(dir / (recipe.name + ".h5"));
    infer::LoadedModel twin = infer::load_model(dir / (recipe.name + "-twin.h5"));
    CHECK(m.quantization == recipe.name);
    infer::lean_for_inference(*m.params);
    infer::lean_for_inference(*twin.params);
    for (const io::NamedTensor& nt : q.blocks.params) {
      if (nt.tensor.dtype() != DType::u8) continue;
      CAPTURE(nt.name);
      const Param& p = m.params->at(nt.name);
      const BlockFormat f =
          cpu::parse_block_format(io::block_format_of(q.blocks.model_config, nt.name));
      CHECK(p.value.dtype() == cpu::dtype_of_block_format(f));
      CHECK(p.compute.raw() == p.value.raw());  // read in place: no f32 copy
      CHECK(std::memcmp(p.value.raw(), nt.tensor.raw(), nt.tensor.nbytes()) == 0);  // GGUF's bytes
    }

    // The tiled sgemm path alone: block rows dequantise exactly to the twin's weights, so every
    // logit is the twin's, bit for bit.
    cpu::set_gemv_enabled(false);
    const std::vector<float> wide = decode(*m.model), wide_twin = decode(*twin.model);
    cpu::set_gemv_enabled(true);
    CHECK(same_bits(wide, wide_twin));

    // With the GEMV, products of at most 8 rows multiply inputs rounded to 8 bits: each input
    // moves by at most max|x| / 254 of its block (q8_k: 256 values; q8_0 for mxfp4: 32), each
    // product by at most that times sum |w| (the op test above). Rounding errors of random
    // inputs are spread, about step / sqrt(12) an input: about (max|x| / 127) / 3.5 / rms|x|, or
    // 0.7% of a product's size for 256-blocks (max|x| ~ 3 rms|x|; 0.5% for 32-blocks). A logit
    // lies behind 9 such products in series (q/k/v, o, w1/w3 then w2 in 2 layers, the LM head),
    // through residual streams, norms and softmaxes that may amplify them: a few percent of the
    // logits (sqrt(9) x 0.7% ~ 2% if they add at random). Bound: 5% of the largest logit
    // (measured 1.3-2.1%, the larger for the 4-bit formats; Q8_0's 32-blocks gave 0.6%,
    // test_decode), and never 0 (inputs rounded).
    const std::vector<float> decoded = decode(*m.model), twin_decoded = decode(*twin.model);
    const auto [worst, scale] = difference(decoded, twin_decoded);
    INFO("decode: max |logit - twin's| " << worst << " of max |logit| " << scale);
    CHECK(worst > 0);
    CHECK(worst <= 0.05 * scale);

    // Decode (cache, one token a step) and full-sequence scoring (the GEMV for expert segments
    // of at most 8 rows only; measured 0.5-0.8%): the twin's agree to f32 rounding; the block
    // model's each lie within the bound of the twin's, so within twice it of each other
    // (measured 1.4-2.1%).
    const std::vector<float> scored = score(*m.model), twin_scored = score(*twin.model);
    const auto [twin_gap, twin_scale] = difference(twin_decoded, twin_scored);
    CHECK(twin_gap <= 1e-5 * twin_scale);
    const auto [score_worst, score_scale] = difference(scored, twin_scored);
    INFO("scoring: max |logit - twin's| " << score_worst << " of " << score_scale);
    CHECK(score_worst > 0);
    CHECK(score_worst <= 0.05 * score_scale);
    const auto [gap, gap_scale] = difference(decoded, scored);
    INFO("decode vs scoring: max |difference| " << gap << " of " << gap_scale);
    CHECK(gap <= 0.1 * gap_scale);

    // One fixed order per output: decode gives the same bits at 1 and 2 threads.
    set_num_threads(1);
    const std::vector<float> one = decode(*m.model);
    set_num_threads(2);
    CHECK(same_bits(one, decode(*m.model)));
    CHECK(same_bits(one, decoded));
  }
}

TEST_CASE("block weights: damaged and misused block rows are refused by name", "[block_weights]") {
  test::ScratchDir dir("block-weights-bad");
  const ModelConfig config = block_model_config();
  const Quantised q =
      quantise(noisy_checkpoint(config, 6), "q4_k_m", [](int64_t t) { return kWeights[t % 3]; });
  const nlohmann::json& formats = q.blocks.model_config[io::kTensorFormatsKey];
  // Loads q.blocks with tensor `name` changed; the error it gives.
  auto load_with = [&](const std::string& name, const std::function<void(Tensor&)>& change) {
    io::Checkpoint bad = q.blocks;
    for (io::NamedTensor& nt : bad.params)
      if (nt.name == name) {
        nt.tensor = nt.tensor.clone();
        change(nt.tensor);
      }
    io::save_checkpoint(dir / "bad.h5", bad);
    return test::error_of([&] { infer::load_model(dir / "bad.h5"); });
  };
  const uint16_t f16_inf = 0x7c00;
  for (BlockFormat f : kWeights) {
    INFO(cpu::block_format_name(f));
    std::string name;
    for (const io::NamedTensor& nt : q.blocks.params)
      if (name.empty() && formats.value(nt.name, "") == cpu::block_format_name(f)) name = nt.name;
    REQUIRE(!name.empty());
    // Row 5, its last block (expert tensors: rows of every expert, one after the other).
    std::string error = load_with(name, [&](Tensor& t) {
      const int64_t row_bytes = t.dim(-1), last = row_bytes - cpu::block_bytes(f);
      uint8_t* block = t.data<uint8_t>() + 5 * row_bytes + last;
      if (f == BlockFormat::q4_k) std::memcpy(block, &f16_inf, 2);  // d
      if (f == BlockFormat::q6_k) std::memcpy(block + 208, &f16_inf, 2);
      if (f == BlockFormat::mxfp4) block[0] = 0xFF;  // E8M0's NaN
    });
    INFO(error);
    CHECK(error.find(str("'", name, "' row 5 block")) != std::string::npos);
    CHECK(error.find(f == BlockFormat::mxfp4 ? "has scale nan" : "has scale inf") !=
          std::string::npos);
    CHECK(error.find("damaged") != std::string::npos);
    // Rows a block short; f32 values where block rows are listed.
    error = load_with(name, [&](Tensor& t) {
      Shape s = t.shape();
      s.back() -= cpu::block_bytes(f);
      t = Tensor::zeros(s, DType::u8);
    });
    CHECK(error.find(str("does not hold parameter ", name)) != std::string::npos);
    error = load_with(name, [&](Tensor& t) {
      for (const io::NamedTensor& nt : q.twin.params)
        if (nt.name == name) t = nt.tensor;
    });
    CHECK(error.find(str("does not hold parameter ", name)) != std::string::npos);
  }
  // q4_k's dmin is checked too.
  std::string q4k;
  for (const io::NamedTensor& nt : q.blocks.params)
    if (q4k.empty() && formats.value(nt.name, "") == "q4_k") q4k = nt.name;
  CHECK(load_with(q4k, [&](Tensor& t) {
          std::memcpy(t.data<uint8_t>() + 2, &f16_inf, 2);
        }).find(str("'", q4k, "' row 0 block 0 has scale inf")) != std::string::npos);

  // The loaded block rows exist in memory only: writing them is refused by name.
  io::save_checkpoint(dir / "good.h5", q.blocks);
  infer::LoadedModel m = infer::load_model(dir / "good.h5");
  io::Checkpoint loaded = q.blocks;
  for (io::NamedTensor& nt : loaded.params)
    if (nt.name == q4k) nt.tensor = m.params->at(q4k).value;
  CHECK(test::error_of([&] {
          io::save_checkpoint(dir / "loaded.h5", loaded);
        }).find("in memory only") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "loaded.h5"));
}
