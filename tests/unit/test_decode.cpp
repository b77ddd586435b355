// Decode on the CPU with the GEMV path and low-bit weights, model level: the GEMV's logits equal
// the tiled sgemm's to fp32 rounding; a lean bf16/f16 model (weights kept in 16 bits) gives the
// bits of the same values widened to f32; a Q8_0 checkpoint's logits stay within its 8-bit
// inputs' rounding of its dequantised weights'; generation is bitwise the same at 1 and 2 threads;
// damaged or misused Q8_0 files are refused by name. Shapes: a tiny mixtral (d 32, F 48, 4 experts
// top-2, 2 layers).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "backend/cpu/backend.h"
#include "backend/cpu/gemv.h"
#include "kernels/convert.h"
#include "moe/arena.h"
#include "moe/infer/generate.h"
#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "moe/io/convert.h"
#include "moe/models/transformer.h"
#include "moe/ops/core.h"
#include "moe/rng.h"
#include "moe/threads.h"
#include "support/run.h"

using namespace moe;

namespace {

ModelConfig tiny(DType dtype, Arch arch = Arch::mixtral) {
  ModelConfig c;
  c.arch = arch;  // gpt: biases (2-D per expert), learned positions, tied embedding
  c.layers = 2, c.d_model = 32, c.heads = 4, c.d_ff = 48, c.seq = 32;
  c.kv_heads = arch == Arch::mixtral ? 2 : 0;
  c.experts = 4, c.top_k = 2, c.moe_every = 1, c.normalize_topk = arch == Arch::mixtral;
  c.dtype = dtype;
  c.resolve();
  return c;
}

struct Built {
  ModelConfig config;
  std::unique_ptr<ParamSet> params;
  std::unique_ptr<Transformer> model;
  Built(const ModelConfig& c, uint64_t seed) : config(c) {
    params = std::make_unique<ParamSet>(seed, c.dtype);
    model = std::make_unique<Transformer>(c, *params);
  }
};

// Logits of a 12-token prefill (its attention projections take the tiled sgemm: more than
// kGemvMaxRows rows; its expert segments and LM head row are smaller) and of 3 decode steps
// (the GEMV), concatenated.
std::vector<float> run(const Transformer& model) {
  KVCache cache = model.make_cache(1);
  std::vector<float> out;
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < 12; ++i) ids.push_back((i * 29 + 3) % 256);
  Tensor logits = model.forward_cached(Tensor::from_vector({12}, ids), {12}, {0}, cache);
  for (int step = 0; step < 4; ++step) {
    const float* l = logits.data<float>();
    out.insert(out.end(), l, l + logits.numel());
    if (step == 3) break;
    logits = model.forward_cached(Tensor::from_vector({1}, std::vector<int32_t>{step * 7 + 5}), {1},
                                  {0}, cache);
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("decode: the GEMV's logits equal the tiled sgemm's to fp32 rounding", "[decode]") {
  Built b(tiny(DType::f32), 11);
  cpu::set_gemv_enabled(false);
  const std::vector<float> sgemm = run(*b.model);
  cpu::set_gemv_enabled(true);
  const std::vector<float> gemv = run(*b.model);
  REQUIRE(sgemm.size() == gemv.size());
  // Decode: each product sums K <= 48 terms in another order than a BLAS tile; per product the
  // difference is within 2 K eps of the terms' magnitudes, and two layers of norms, softmax and
  // residuals carry it to the logits (O(1) here) without amplifying it by more than ~10:
  // 2 * 48 * 1.2e-7 * 10 ~ 1e-4.
  double worst = 0, scale = 0;
  for (size_t i = 0; i < gemv.size(); ++i) {
    worst = std::max(worst, std::fabs(double(gemv[i]) - double(sgemm[i])));
    scale = std::max(scale, std::fabs(double(sgemm[i])));
  }
  CHECK(worst > 0);  // the decode steps did take the other path
  CHECK(worst <= 1e-4 * std::max(1.0, scale));
}

TEST_CASE("decode: 16-bit weights kept in 16 bits give the bits of the widened model", "[decode]") {
  for (Arch arch : {Arch::mixtral, Arch::gpt})
    for (DType dtype : {DType::bf16, DType::f16}) {
      CAPTURE(arch_name(arch), dtype_name(dtype));
      Built wide(tiny(dtype, arch), 5), lean(tiny(dtype, arch), 5);
      const size_t released = infer::lean_for_inference(*lean.params);
      CHECK(released > 0);
      for (const Param* p : lean.params->all()) {
        CAPTURE(p->name);
        CHECK(!p->grad.defined());
        const bool matrix = io::quantizable(p->name, p->value.shape());
        CHECK((p->compute.raw() == p->value.raw()) == matrix);
        CHECK(p->compute.dtype() == (matrix ? dtype : DType::f32));
      }
      // Prefill widens into a scratch for the same sgemm; decode widens in registers: the values
      // are those of the f32 copy (exact), so every logit has the same bits.
      CHECK(same_bits(run(*lean.model), run(*wide.model)));
    }
}

TEST_CASE("decode: generation gives the same bits at 1 and 2 threads", "[decode]") {
  Built b(tiny(DType::bf16), 3);
  infer::lean_for_inference(*b.params);
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 2, 3}, {4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, {65}};
  infer::SamplingConfig s;
  s.max_new = 8;
  s.temperature = 0.8;
  s.seed = 9;
  const int before = num_threads();
  set_num_threads(1);
  const auto one = infer::generate(*b.model, prompts, s, 2);
  set_num_threads(2);
  const auto two = infer::generate(*b.model, prompts, s, 2);
  set_num_threads(before);
  REQUIRE(one.size() == two.size());
  for (size_t i = 0; i < one.size(); ++i) CHECK(one[i].tokens == two[i].tokens);
  CHECK(one[0].tokens.size() == 8);
}

TEST_CASE("decode: one head's cached attention gives the same bits with AVX-512 and without",
          "[decode]") {
  if (!cpu::gemv_isa_supported(cpu::GemvIsa::avx512)) {
    WARN("no AVX-512 on this CPU: the wide decode head is not compared");
    return;
  }
  // Head widths with and without a partial 16-lane step, contexts of 1 key to 300, keys ldk
  // apart (two kv heads side by side), values of both signs and magnitudes.
  for (const int64_t hd : {64, 40, 16, 7, 100})
    for (const int64_t start : {0, 1, 17, 299}) {
      CAPTURE(hd, start);
      const int64_t ldk = 2 * hd, keys = start + 1;
      std::vector<float> q(static_cast<size_t>(hd)), k(static_cast<size_t>(keys * ldk)),
          v(static_cast<size_t>(keys * ldk));
      for (size_t i = 0; i < q.size(); ++i) q[i] = rng_normal(11, i);
      for (size_t i = 0; i < k.size(); ++i) k[i] = rng_normal(12, i) * (i % 7 == 0 ? 30.0f : 1.0f);
      for (size_t i = 0; i < v.size(); ++i) v[i] = rng_normal(13, i);
      const auto nk = static_cast<size_t>(keys), nh = static_cast<size_t>(hd);
      std::vector<float> ps1(nk), ps2(nk), c1(nh), c2(nh);
      const float scale = 1.0f / std::sqrt(float(hd));
      cpu::decode_head(q.data(), k.data(), v.data(), ldk, start, hd, scale, ps1.data(), c1.data(),
                       false);
      cpu::decode_head(q.data(), k.data(), v.data(), ldk, start, hd, scale, ps2.data(), c2.data(),
                       true);
      CHECK(std::memcmp(ps1.data(), ps2.data(), ps1.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)) == 0);
      // and the context is the probabilities' weighted sum of the values (a reference in double)
      double worst = 0;
      for (int64_t e = 0; e < hd; ++e) {
        double ref = 0, mag = 0;
        for (int64_t j = 0; j < keys; ++j) {
          ref += double(ps1[size_t(j)]) * double(v[size_t(j * ldk + e)]);
          mag += std::fabs(double(ps1[size_t(j)]) * double(v[size_t(j * ldk + e)]));
        }
        worst = std::max(worst, std::fabs(double(c1[size_t(e)]) - ref) / std::max(mag, 1e-30));
      }
      // f32: `keys` rounded products and keys - 1 rounded additions (the first adds to 0
      // exactly), each within 2^-24 of sum |terms|. The worst case, (2 keys - 1) x 2^-24, needs
      // every rounding to go the same way; this bound is about half of it, and it holds because
      // independent roundings cancel in part (their sum grows like sqrt(keys), far below it).
      CHECK(worst <= double(keys) * 6e-8);
    }
}

TEST_CASE("decode: a Q8_0 checkpoint scores near its dequantised weights, bad ones are refused",
          "[decode]") {
  test::ScratchDir dir("decode-q8");
  {  // gpt: its 2-D expert biases stay f32; it serves as its dequantised weights too
    Built g(tiny(DType::f32, Arch::gpt), 4);
    io::Checkpoint c;
    c.model_config = to_json(g.config);
    for (const Param* p : g.params->all()) c.params.push_back({p->name, p->value, p->expert, {}});
    const io::Checkpoint q = io::quantize(c, "q8_0");
    int64_t quantized = 0;
    for (const io::NamedTensor& nt : q.params) {
      CAPTURE(nt.name);
      const bool bias = nt.name.find(".b1") != std::string::npos ||
                        nt.name.find(".b2") != std::string::npos ||
                        nt.name.find(".bias") != std::string::npos;
      if (bias || nt.name.rfind("embed.", 0) == 0 || nt.name.find(".router.") != std::string::npos)
        CHECK(nt.tensor.dtype() == DType::f32);
      quantized += nt.tensor.dtype() == DType::u8;
    }
    CHECK(quantized > 0);
    io::save_checkpoint(dir / "gpt.h5", q);
    infer::LoadedModel m = infer::load_model(dir / "gpt.h5");
    infer::lean_for_inference(*m.params);
    const std::vector<float> logits = run(*m.model);
    for (float v : logits) REQUIRE(std::isfinite(v));
  }
  Built b(tiny(DType::f32), 21);
  io::Checkpoint ckpt;
  ckpt.model_config = to_json(b.config);
  for (const Param* p : b.params->all()) ckpt.params.push_back({p->name, p->value, p->expert, {}});
  io::QuantReport report;
  const io::Checkpoint q = io::quantize(ckpt, "q8_0", &report);
  CHECK(report.tensors_quantized > 0);
  CHECK(report.max_error_over_scale <= 0.5);
  CHECK(report.bytes_after < report.bytes_before / 2);  // f32 embedding kept
  io::save_checkpoint(dir / "q.h5", q);

  // The f32 model with each quantised weight replaced by its dequantised values.
  Built deq(tiny(DType::f32), 21);
  for (const io::NamedTensor& nt : q.params) {
    if (nt.tensor.dtype() != DType::u8) continue;
    Param& p = deq.params->at(nt.name);
    const int64_t in = p.value.shape().back(), rows = p.value.numel() / in;
    for (int64_t r = 0; r < rows; ++r)
      cpu::dequantize_q8_0_row(nt.tensor.data<uint8_t>() + r * cpu::q8_row_bytes(in), in,
                               p.value.data<float>() + r * in);
    p.refresh_compute();
  }
  infer::LoadedModel m = infer::load_model(dir / "q.h5");
  CHECK(m.quantization == "q8_0");
  infer::lean_for_inference(*m.params);
  CHECK(m.params->at("blocks.0.moe.experts.w1").compute.dtype() == DType::q8_0);
  {
    // Products of at most 8 rows with Q8_0 weights multiply 8-bit inputs (gemv.h; here the
    // single-token steps and the prompt's experts, 3 rows each on average), the others f32 rows
    // by the widened weights. Each input of a Q8_0 product is rounded by at most 1/254 of its
    // block's largest magnitude, so each product moves by at most 0.4% of sum |w| |x| max;
    // through two blocks' residual streams, norms and softmaxes the logits (O(1) here) move by a
    // few of those: bound 2% of the largest logit (0.6% measured), and never 0 (quantised).
    const std::vector<float> q8 = run(*m.model), f32 = run(*deq.model);
    REQUIRE(q8.size() == f32.size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < q8.size(); ++i) {
      worst = std::max(worst, std::fabs(double(q8[i]) - double(f32[i])));
      scale = std::max(scale, std::fabs(double(f32[i])));
    }
    INFO("Q8_0: max |logit difference| " << worst << " of max |logit| " << scale);
    CHECK(worst > 0);
    CHECK(worst <= 0.02 * scale);
  }

  // Quantising twice, another type, a shard: usage errors naming the problem.
  CHECK_THROWS_WITH(io::quantize(q, "q8_0"), Catch::Contains("already quantised"));
  CHECK_THROWS_WITH(io::quantize(ckpt, "q4_0"), Catch::Contains("--type must be q8_0"));
  // Training cannot resume from it: the parameter is named.
  CHECK_THROWS_WITH(io::check_params_match(*b.params, q.params, "resume"),
                    Catch::Contains("holds quantised rows (moe-convert quantize)"));
  // A damaged scale (an f16 infinity) and a tensor of the wrong row size.
  io::Checkpoint bad = q;
  for (io::NamedTensor& nt : bad.params)
    if (nt.name == "blocks.1.attn.o.weight") {
      nt.tensor = nt.tensor.clone();
      const int64_t in = b.config.d_model;
      const uint16_t inf = 0x7c00;
      std::memcpy(nt.tensor.data<uint8_t>() + 3 * cpu::q8_row_bytes(in) + in, &inf, 2);
    }
  io::save_checkpoint(dir / "bad.h5", bad);
  CHECK(test::error_of([&] {
          infer::load_model(dir / "bad.h5");
        }).find("'blocks.1.attn.o.weight' row 3 block 0 has scale inf") != std::string::npos);
  io::Checkpoint cut = q;
  for (io::NamedTensor& nt : cut.params)
    if (nt.name == "blocks.1.attn.o.weight") {
      Shape s = nt.tensor.shape();
      s.back() -= 2;  // one scale short
      nt.tensor = Tensor::zeros(s, DType::u8);
    }
  io::save_checkpoint(dir / "cut.h5", cut);
  CHECK(test::error_of([&] {
          infer::load_model(dir / "cut.h5");
        }).find("does not hold parameter blocks.1.attn.o.weight") != std::string::npos);

  // The loaded weights are row groups (DType::q8_0), which exist in memory only: writing them is
  // refused by name; a file's u8 rows handed to the ops unpacked are refused too.
  const Tensor& groups = m.params->at("blocks.1.attn.o.weight").value;
  REQUIRE(groups.dtype() == DType::q8_0);
  io::Checkpoint packed = q;
  for (io::NamedTensor& nt : packed.params)
    if (nt.name == "blocks.1.attn.o.weight") nt.tensor = groups;
  CHECK(test::error_of([&] {
          io::save_checkpoint(dir / "packed.h5", packed);
        }).find("in memory only") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "packed.h5"));
  for (const io::NamedTensor& nt : q.params)
    if (nt.name == "blocks.1.attn.o.weight") {
      const int64_t d = b.config.d_model;
      Tensor x = Tensor::zeros({1, d}), y = Tensor::zeros({1, nt.tensor.dim(0)});
      CHECK(test::error_of([&] { ops::gemm(x, false, nt.tensor, true, y); }).find("pack_q8_0") !=
            std::string::npos);
    }
}
