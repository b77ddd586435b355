// The tiny gpt-oss writer and its double-precision reference (support/hf_gpt_oss.h), on their own:
//   - the writer creates every tensor GptOssForCausalLM creates, with transformers' shapes, in
//     f32, in bf16 (norms F32) and in the MXFP4 form;
//   - the test-side MXFP4 dequantiser decodes hand-made bytes as the format says;
//   - each gpt-oss feature of the reference changes the logits, so the import tests that compare
//     against it can fail.
// Shape letters: V vocabulary, D hidden, H heads, KV kv heads, hd head dim, F expert hidden,
// E experts, L layers, T sequence.
#include <catch2/catch.hpp>

#include "support/hf_gpt_oss.h"

using namespace moe;
using namespace moe::test::hf;

TEST_CASE("gpt_oss: the writer creates every tensor of GptOssForCausalLM", "[hf][gpt_oss]") {
  const TinyGptOss t;
  const auto w = gpt_oss_weights(t, 1);
  // embedding, final norm, head; per layer 2 norms, q/k/v/o weights and biases, sinks, router
  // weight and bias, gate_up_proj (+ bias), down_proj (+ bias).
  REQUIRE(w.size() == size_t(3 + t.L * 17));
  const std::string p = "model.layers.1.";
  REQUIRE(w.at(p + "self_attn.q_proj.weight").shape() == Shape{t.H * t.hd, t.D});
  REQUIRE(w.at(p + "self_attn.o_proj.weight").shape() == Shape{t.D, t.H * t.hd});
  REQUIRE(w.at(p + "self_attn.o_proj.bias").shape() == Shape{t.D});
  REQUIRE(w.at(p + "self_attn.sinks").shape() == Shape{t.H});
  REQUIRE(w.at(p + "mlp.router.weight").shape() == Shape{t.E, t.D});
  REQUIRE(w.at(p + "mlp.router.bias").shape() == Shape{t.E});
  REQUIRE(w.at(p + "mlp.experts.gate_up_proj").shape() == Shape{t.E, t.D, 2 * t.F});
  REQUIRE(w.at(p + "mlp.experts.gate_up_proj_bias").shape() == Shape{t.E, 2 * t.F});
  REQUIRE(w.at(p + "mlp.experts.down_proj").shape() == Shape{t.E, t.F, t.D});
  REQUIRE(w.at(p + "mlp.experts.down_proj_bias").shape() == Shape{t.E, t.D});
  REQUIRE(t.H * t.hd != t.D);  // head_dim is read, not derived
  REQUIRE(t.sliding(0));
  REQUIRE_FALSE(t.sliding(1));
  REQUIRE(t.sliding(2));

  // bf16 as save_pretrained writes it: the norms (_keep_in_fp32_modules) stay F32.
  const auto half = gpt_oss_weights(t, 1, DType::bf16);
  for (const auto& [name, tensor] : half) {
    INFO(name);
    REQUIRE(tensor.dtype() == (gpt_oss_norm(name) ? DType::f32 : DType::bf16));
  }
  REQUIRE(half.at("model.norm.weight").dtype() == DType::f32);

  // MXFP4: the experts' matrices as U8 blocks and scales, rows the output features.
  const auto packed = gpt_oss_mxfp4(t, 1);
  REQUIRE(packed.size() == size_t(3 + t.L * 19));
  const std::string x = p + "mlp.experts.";
  REQUIRE_FALSE(packed.count(x + "gate_up_proj"));
  REQUIRE(packed.at(x + "gate_up_proj_blocks").shape() == Shape{t.E, 2 * t.F, t.D / 32, 16});
  REQUIRE(packed.at(x + "gate_up_proj_scales").shape() == Shape{t.E, 2 * t.F, t.D / 32});
  REQUIRE(packed.at(x + "down_proj_blocks").shape() == Shape{t.E, t.D, t.F / 32, 16});
  REQUIRE(packed.at(x + "down_proj_scales").dtype() == DType::u8);
  REQUIRE(packed.at(x + "gate_up_proj_bias").dtype() == DType::bf16);
  const auto dense = gpt_oss_dequantized(packed);
  REQUIRE(dense.at(x + "gate_up_proj").shape() == Shape{t.E, t.D, 2 * t.F});
  REQUIRE(dense.at(x + "down_proj").shape() == Shape{t.E, t.F, t.D});
  REQUIRE(dense.at(x + "down_proj").dtype() == DType::bf16);

  const json c = gpt_oss_config(t);
  REQUIRE(c["rope_parameters"]["truncate"] == false);
  REQUIRE(c["rope_parameters"]["rope_theta"] == t.theta);
  REQUIRE_FALSE(c.contains("layer_types"));  // transformers' default: even layers slide
  REQUIRE(gpt_oss_mxfp4_config(t)["quantization_config"]["quant_method"] == "mxfp4");
}

TEST_CASE("gpt_oss: the test's MXFP4 dequantiser decodes the format", "[hf][gpt_oss][mxfp4]") {
  // One expert, one output row, 32 inputs: byte j holds input 2j (low nibble) and 2j+1 (high).
  Tensor blocks = Tensor::zeros({1, 1, 1, 16}, DType::u8);
  Tensor scales = Tensor::zeros({1, 1, 1}, DType::u8);
  uint8_t* b = blocks.data<uint8_t>();
  b[0] = 0x21;                          // inputs 0, 1: codes 1 (0.5) and 2 (1.0)
  b[1] = 0xF7;                          // inputs 2, 3: codes 7 (6.0) and 15 (-6.0)
  b[15] = 0x98;                         // inputs 30, 31: codes 8 (-0) and 9 (-0.5)
  scales.data<uint8_t>()[0] = 127 + 3;  // 2^3
  const std::vector<float> v = hf_mxfp4_dequantize(blocks, scales, DType::f32).to_vector();
  REQUIRE(v.size() == 32);
  REQUIRE(v[0] == 4.0f);
  REQUIRE(v[1] == 8.0f);
  REQUIRE(v[2] == 48.0f);
  REQUIRE(v[3] == -48.0f);
  REQUIRE(v[4] == 0.0f);
  REQUIRE(v[30] == 0.0f);
  REQUIRE(std::signbit(v[30]));
  REQUIRE(v[31] == -4.0f);
  // Subnormal scales: 2^(1 - 127) times 0.5 is still exact in f32.
  scales.data<uint8_t>()[0] = 1;
  REQUIRE(hf_mxfp4_dequantize(blocks, scales, DType::f32).to_vector()[0] == std::ldexp(1.0f, -127));
  // 0xFF is 2^128, inf in f32 as torch.ldexp computes it: inf, and NaN for a zero code.
  scales.data<uint8_t>()[0] = 0xFF;
  const std::vector<float> bad = hf_mxfp4_dequantize(blocks, scales, DType::f32).to_vector();
  REQUIRE(std::isinf(bad[0]));
  REQUIRE(std::isnan(bad[4]));

  // Two rows, 64 inputs: the result is transposed to [in, rows].
  Tensor b2 = Tensor::zeros({1, 2, 2, 16}, DType::u8), s2 = Tensor::zeros({1, 2, 2}, DType::u8);
  for (int i = 0; i < 4; ++i) s2.data<uint8_t>()[i] = 127;
  b2.data<uint8_t>()[1 * 32 + 16 + 0] = 0x03;  // row 1, block 1, input 32: code 3 (1.5)
  const Tensor d = hf_mxfp4_dequantize(b2, s2, DType::f32);
  REQUIRE(d.shape() == Shape{1, 64, 2});
  REQUIRE(d.data<float>()[32 * 2 + 1] == 1.5f);
  REQUIRE(d.data<float>()[32 * 2 + 0] == 0.0f);
}

TEST_CASE("gpt_oss: each feature of the reference changes the logits", "[hf][gpt_oss]") {
  const TinyGptOss t;
  const auto w = gpt_oss_weights(t, 2);
  const int64_t T = 16;  // longer than the window (4)
  const auto ids = random_token_ids(T, int32_t(t.V), 3);
  const Vec base = gpt_oss_reference_logits(t, w, ids, 1, T);
  auto gap = [&](const TinyGptOss& other, const std::map<std::string, Tensor>& weights) {
    return relative_gap(gpt_oss_reference_logits(other, weights, ids, 1, T), base);
  };
  auto zeroed = [&](const std::string& suffix) {
    auto changed = w;
    for (auto& [name, tensor] : changed)
      if (name.ends_with(suffix)) tensor = Tensor::zeros(tensor.shape());
    return gap(t, changed);
  };
  // Every difference is far above double rounding (~1e-14): 1e-3 relative to the logits' scale.
  for (const char* suffix : {"self_attn.sinks", "q_proj.bias", "k_proj.bias", "v_proj.bias",
                             "o_proj.bias", "router.bias", "gate_up_proj_bias", "down_proj_bias"}) {
    INFO(suffix);
    REQUIRE(zeroed(suffix) > 1e-3);
  }
  auto with = [&](auto&& change) {
    TinyGptOss other = t;
    change(other);
    return gap(other, w);
  };
  // Sliding layers: the same layers over the whole context differ.
  REQUIRE(with([](TinyGptOss& o) {
            o.layer_types = {"full_attention", "full_attention", "full_attention"};
          }) > 1e-3);
  REQUIRE(with([](TinyGptOss& o) { o.window = 8; }) > 1e-3);
  // The clamp bites at 0.5 (it rarely does at 7 on these scales); alpha changes the gate.
  REQUIRE(with([](TinyGptOss& o) { o.limit = 0.5; }) > 1e-3);
  REQUIRE(with([](TinyGptOss& o) { o.alpha = 1.0; }) > 1e-3);
  // YaRN with truncate false against llama.cpp's floor/ceil of the ramp, and against none.
  REQUIRE(with([](TinyGptOss& o) { o.yarn.truncate = true; }) > 1e-3);
  REQUIRE(with([](TinyGptOss& o) { o.yarn = test::YarnRef{}; }) > 1e-3);
  // Sanity of the window: one covering the sequence is the full attention.
  TinyGptOss wide = t, full = t;
  wide.window = T;
  full.layer_types = {"full_attention", "full_attention", "full_attention"};
  REQUIRE(relative_gap(gpt_oss_reference_logits(wide, w, ids, 1, T),
                       gpt_oss_reference_logits(full, w, ids, 1, T)) < 1e-12);
}
