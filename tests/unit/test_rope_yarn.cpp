// YaRN RoPE scaling (moe/rope_scaling.h, ops::yarn_scaling): the correction range and attention
// factor as transformers' _compute_yarn_parameters derives them, and the kernels' cos/sin table
// against a double-precision reference written from the YaRN formula, with one pair of each of the
// ramp's three regions checked by hand. Shape letters: T sequence, H heads, hd head dim, rd rotated
// features of a head (pairs i < rd/2).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "backend/cuda/rope.cuh"
#include "moe/error.h"
#include "moe/models/config.h"
#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#include "support/cuda.h"
#include "support/gradcheck.h"

using namespace moe;

namespace {

// inv_freq of pair i in double, straight from the formula (not from the kernel's code).
double yarn_inv_freq(const ops::RopeScaling& s, int64_t i, int64_t rd, double theta) {
  const double trained = std::pow(theta, -2.0 * double(i) / double(rd));
  const double r = std::clamp((double(i) - s.ramp_low) / s.ramp_width, 0.0, 1.0);
  return trained * (1.0 - r) + trained / s.factor * r;
}

// y against a (R x) in double for every element (rotate-half pairs (i, i + rd/2) of each head).
void check_yarn_rope(const Tensor& x, const Tensor& y, int64_t seq, int64_t heads, int64_t rd,
                     int64_t offset, double theta, const ops::RopeScaling& s) {
  const int64_t width = x.dim(1), hd = width / heads, half = rd / 2;
  const float* xs = x.data<float>();
  const float* ys = y.data<float>();
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = double(offset + t) * yarn_inv_freq(s, i, rd, theta);
        const double c = s.attention_factor * std::cos(angle);
        const double sn = s.attention_factor * std::sin(angle);
        const int64_t at = t * width + h * hd;
        const double a = xs[at + i], b = xs[at + i + half];
        INFO("t " << t << " head " << h << " pair " << i);
        // fp32 angles: position (< 64) x inv_freq rounded to 2^-24 relative, then cos/sin of it
        REQUIRE(ys[at + i] == Approx(a * c - b * sn).margin(2e-5));
        REQUIRE(ys[at + i + half] == Approx(b * c + a * sn).margin(2e-5));
      }
}

}  // namespace

TEST_CASE("yarn: the correction range and attention factor of DeepSeek-V3 and gpt-oss",
          "[rope][yarn]") {
  // DeepSeek-V3's rope_scaling: factor 40 over 4096 positions, betas 32 / 1, mscale and
  // mscale_all_dim 1; 64 rotated features, theta 10000. By hand: pair i turns beta times in 4096
  // positions where 64 ln(4096 / (2 pi beta)) / (2 ln 10000) = i: 10.47 for beta 32 (floored to
  // 10), 22.51 for beta 1 (ceiled to 23). mscale equal to mscale_all_dim: attention factor 1.
  ops::YarnSettings v3;
  v3.factor = 40, v3.original_ctx = 4096, v3.mscale = 1, v3.mscale_all_dim = 1;
  const ops::RopeScaling s = ops::yarn_scaling(v3, 10000, 64);
  REQUIRE(s.factor == 40.0f);
  REQUIRE(s.ramp_low == 10.0f);
  REQUIRE(s.ramp_width == 13.0f);
  REQUIRE(s.attention_factor == 1.0f);
  // DeepSeek's softmax scale factor mscale(40, mscale_all_dim 1)^2 = (0.1 ln 40 + 1)^2.
  REQUIRE(ops::yarn_mscale(40, 1) == Approx(1.3688879454113936));

  // gpt-oss: factor 32 over 4096, theta 150000, head 64, truncate false (the range stays
  // fractional: 8.0928 .. 17.3980), no mscale: attention factor 0.1 ln 32 + 1 = 1.34657.
  ops::YarnSettings oss;
  oss.factor = 32, oss.original_ctx = 4096, oss.truncate = false;
  const ops::RopeScaling g = ops::yarn_scaling(oss, 150000, 64);
  REQUIRE(g.ramp_low == Approx(8.0927791).epsilon(1e-6));
  REQUIRE(g.ramp_width == Approx(17.3980245 - 8.0927791).epsilon(1e-6));
  REQUIRE(g.attention_factor == Approx(1.3465736).epsilon(1e-6));
  // An explicit attention_factor wins over the derived one; mscale over mscale_all_dim otherwise.
  oss.attention_factor = 0.75;
  REQUIRE(ops::yarn_scaling(oss, 150000, 64).attention_factor == 0.75f);
  v3.mscale = 0.707, v3.mscale_all_dim = 1;
  REQUIRE(ops::yarn_scaling(v3, 10000, 64).attention_factor ==
          Approx((0.0707 * std::log(40.0) + 1) / (0.1 * std::log(40.0) + 1)));
}

TEST_CASE("yarn: settings that give no ramp are refused by name", "[rope][yarn]") {
  ops::YarnSettings y;
  y.factor = 0.5, y.original_ctx = 4096;
  // Named by moe-train's flag and by the HF key (import-hf's user has the key, not the flag).
  REQUIRE_THROWS_WITH(ops::yarn_scaling(y, 10000, 64),
                      Catch::Contains("--rope-factor must be >= 1 (got 0.5): YaRN's \"factor\", as "
                                      "an HF config names it"));
  y.factor = std::numeric_limits<double>::infinity();
  REQUIRE_THROWS_WITH(ops::yarn_scaling(y, 10000, 64),
                      Catch::Contains("--rope-factor must be >= 1 (got inf)"));
  y.factor = 4, y.original_ctx = 0;
  REQUIRE_THROWS_WITH(ops::yarn_scaling(y, 10000, 64),
                      Catch::Contains("--original-max-position-embeddings must be >= 1 position "
                                      "(got 0): YaRN's \"original_max_position_embeddings\""));
  y.original_ctx = 4096, y.beta_slow = 0;
  REQUIRE_THROWS_WITH(ops::yarn_scaling(y, 10000, 64),
                      Catch::Contains("--beta-slow must be > 0 (got 0): YaRN's \"beta_slow\""));
  y.beta_slow = 1, y.mscale_all_dim = -1;
  REQUIRE_THROWS_WITH(ops::yarn_scaling(y, 10000, 64),
                      Catch::Contains("--mscale-all-dim must be >= 0 (0 = absent) (got -1)"));
  y.mscale_all_dim = 0;  // theta 1 gives every pair one frequency: the range divides by ln 1
  REQUIRE_THROWS_WITH(ops::yarn_scaling(y, 1, 64),
                      Catch::Contains("YaRN needs --rope-theta > 1 (got 1)"));
}

TEST_CASE("yarn: the RoPE table against the double formula, one pair per ramp region by hand",
          "[rope][yarn]") {
  // rd 16 (8 pairs), theta 10000, factor 4 over 2048 positions: the range is pairs
  // floor(2.016) = 2 .. ceil(5.026) = 6. Pairs 0-1 keep their trained frequency, 2-6 ramp, 7 is
  // divided by the factor. Attention factor 0.1 ln 4 + 1.
  ops::YarnSettings y;
  y.factor = 4, y.original_ctx = 2048;
  const ops::RopeScaling s = ops::yarn_scaling(y, 10000, 16);
  REQUIRE(s.ramp_low == 2.0f);
  REQUIRE(s.ramp_width == 4.0f);
  const double af = 0.1 * std::log(4.0) + 1.0;
  REQUIRE(s.attention_factor == Approx(af));

  // Hand-checked pairs at position 100, read from a unit vector (x_i = 1, x_{i+8} = 0 gives
  // y_i = a cos, y_{i+8} = a sin): pair 1 (trained) 10000^(-1/8) = 0.316228; pair 4 (half way, r
  // 0.5) 0.01 (0.5 + 0.5 / 4) = 0.00625; pair 7 (interpolated) 10000^(-7/8) / 4 = 7.90569e-5.
  const int64_t pos = 100;
  const std::pair<int64_t, double> hand[] = {
      {1, 0.31622776601683794}, {4, 0.00625}, {7, 7.905694150420949e-05}};
  for (auto [pair, inv_freq] : hand) {
    INFO("pair " << pair);
    std::vector<float> unit(16, 0.0f);
    unit[static_cast<size_t>(pair)] = 1.0f;
    Tensor x = Tensor::from_vector({1, 16}, unit), out = Tensor::empty({1, 16});
    ops::rope_forward(x, 1, 1, 1, 10000.0f, out, pos, 0, s);
    REQUIRE(out.data<float>()[pair] == Approx(af * std::cos(pos * inv_freq)).margin(2e-5));
    REQUIRE(out.data<float>()[pair + 8] == Approx(af * std::sin(pos * inv_freq)).margin(2e-5));
  }

  // Every element of a random input, several heads, partial rotary (rd 16 of hd 24), an offset.
  const int64_t T = 9, H = 3, hd = 24, offset = 40;
  Tensor x = test::random_tensor({T, H * hd}, 4401), out = Tensor::empty(x.shape());
  ops::rope_forward(x, 1, T, H, 10000.0f, out, offset, 16, s);
  check_yarn_rope(x, out, T, H, 16, offset, 10000.0, s);
  for (int64_t t = 0; t < T; ++t)  // the unrotated features pass through
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 16; j < hd; ++j)
        REQUIRE(out.data<float>()[t * H * hd + h * hd + j] ==
                x.data<float>()[t * H * hd + h * hd + j]);
}

TEST_CASE("yarn: the backward is the transpose of the scaled rotation", "[rope][yarn]") {
  // <a R x, g> = <x, (a R)^T g> for random x, g: the backward with the same table.
  ops::YarnSettings y;
  y.factor = 8, y.original_ctx = 512, y.truncate = false;
  const ops::RopeScaling s = ops::yarn_scaling(y, 500, 32);
  const int64_t T = 7, H = 2, hd = 32;
  Tensor x = test::random_tensor({T, H * hd}, 4402), g = test::random_tensor({T, H * hd}, 4403);
  Tensor rx = Tensor::empty(x.shape()), rtg = Tensor::empty(x.shape());
  ops::rope_forward(x, 1, T, H, 500.0f, rx, 3, 0, s);
  ops::rope_backward(g, 1, T, H, 500.0f, rtg, 3, 0, s);
  double lhs = 0, rhs = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    lhs += double(rx.data<float>()[i]) * g.data<float>()[i];
    rhs += double(x.data<float>()[i]) * rtg.data<float>()[i];
  }
  REQUIRE(lhs == Approx(rhs).epsilon(1e-5));  // fp32 products of ~450 terms of magnitude ~1
  // And it is not the plain rotation's transpose (the attention factor 0.1 ln 8 + 1 shows).
  Tensor plain = Tensor::empty(x.shape());
  ops::rope_backward(g, 1, T, H, 500.0f, plain, 3, 0);
  REQUIRE(rtg.data<float>()[0] != Approx(plain.data<float>()[0]).epsilon(1e-3));
}

TEST_CASE("yarn: the CUDA table body gives the CPU op's bits", "[rope][yarn][cuda-harness]") {
  // The single-source table entry (kernels::rope_table_entry) run as the CUDA kernel body on the
  // CPU, then the rotation body: the same bits as the CPU op with the same scaling.
  ops::YarnSettings y;
  y.factor = 40, y.original_ctx = 4096, y.mscale = 0.707, y.mscale_all_dim = 1;
  const ops::RopeScaling sc = ops::yarn_scaling(y, 10000, 64);
  const int64_t T = 5, H = 2, hd = 64, half = hd / 2, offset = 11;
  Tensor x = test::random_tensor({T, H * hd}, 4404), ref = Tensor::empty(x.shape());
  ops::rope_forward(x, 1, T, H, 10000.0f, ref, offset, 0, sc);
  const std::vector<float> xs = x.to_vector();
  for (auto shape : test::kHarnessGrids) {
    std::vector<float> cos_table(T * half), sin_table(T * half), out(xs.size());
    cuda::run_grid_on_cpu<cuda::body::RopeTable>(shape, cos_table.data(), sin_table.data(), T, half,
                                                 hd, 10000.0f, offset, sc);
    cuda::run_grid_on_cpu<cuda::body::RopeRotate>(
        shape, xs.data(), out.data(), static_cast<const float*>(cos_table.data()),
        static_cast<const float*>(sin_table.data()), T, T, H, hd, hd, false);
    REQUIRE(out == ref.to_vector());
  }
}

TEST_CASE("yarn: a model config without RoPE scaling reads and writes as before",
          "[rope][yarn][config]") {
  // A checkpoint written before YaRN existed has no rope_type key: it reads as plain RoPE, and
  // writing it back gives the same JSON (no new keys), so its HDF5 attrs stay bitwise.
  ModelConfig plain;
  plain.arch = Arch::mixtral;
  plain.resolve();
  const nlohmann::json old = to_json(plain);
  REQUIRE_FALSE(old.contains("rope_type"));
  REQUIRE_FALSE(old.contains("yarn"));
  const ModelConfig read = model_config_from_json(old);
  REQUIRE(read.rope_type == RopeType::none);
  REQUIRE(read.rope_scaling().plain());
  REQUIRE(read.attention_scale() == 1.0);
  REQUIRE(to_json(read).dump() == old.dump());

  // With YaRN every setting goes out and back.
  ModelConfig y = plain;
  y.rope_type = RopeType::yarn;
  y.yarn.factor = 32, y.yarn.original_ctx = 4096, y.yarn.truncate = false;
  y.yarn.attention_factor = 1.25, y.yarn.beta_fast = 16;
  const ModelConfig back = model_config_from_json(to_json(y));
  REQUIRE(back.rope_type == RopeType::yarn);
  REQUIRE(to_json(back) == to_json(y));
  REQUIRE(back.rope_scaling() == y.rope_scaling());
  REQUIRE(back.rope_scaling().attention_factor == 1.25f);
  REQUIRE(back.attention_scale() == 1.0);  // the softmax mscale is DeepSeek's alone
  nlohmann::json bad = to_json(y);
  bad["yarn"]["factor"] = 0.5;
  REQUIRE_THROWS_WITH(model_config_from_json(bad),
                      Catch::Contains("--rope-factor must be >= 1 (got 0.5)"));
  ModelConfig gpt;
  gpt.rope_type = RopeType::yarn;
  gpt.yarn = y.yarn;
  REQUIRE_THROWS_WITH(gpt.resolve(), Catch::Contains("--rope-scaling yarn needs a RoPE "
                                                     "architecture: --arch gpt has learned "
                                                     "positions"));
}
