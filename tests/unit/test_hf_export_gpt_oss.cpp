// export-hf of gpt-oss (issue 44, C6): a gpt_oss model goes out as transformers 5.25 saves
// GptOssForCausalLM. Checked against the test writer of support/hf_gpt_oss.h (the config keys
// and every tensor's name, shape and dtype, for the same shapes), against the layout written out
// here from modeling_gpt_oss.py (x @ W: gate_up_proj[e][d][2f] is w1[e][f][d], [2f+1] w3's;
// down_proj[e][f][d] is w2[e][d][f]; biases interleaved the same way), the same bytes from a
// checkpoint opened lazily (experts built one at a time), kept MXFP4 experts written back as HF's
// _blocks/_scales (decoded by the test's HF dequantiser), refusals by name, and the round trip:
// the writer's directory (f32, bf16 with F32 norms, with and without GptOssConfig's defaults
// written) -> import-hf -> export-hf gives every tensor back byte for byte and the same config
// keys, and the import of the export is the same model, scoring the same bits.
// Shape letters: V vocabulary, D hidden, H heads, KV kv heads, hd head dim, F expert hidden,
// E experts, k top-k, L layers.
#include <catch2/catch.hpp>
#include <fstream>

#include "moe/io/convert.h"
#include "moe/io/safetensors.h"
#include "support/hf_gpt_oss.h"
#include "support/models.h"

using namespace moe;
using namespace moe::test::hf;

namespace {

json config_of(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  return json::parse(in);
}

// Our gpt_oss model of the writer's shapes (TinyGptOss's defaults, its layers 0 and 2 sliding).
ModelConfig model_of(const TinyGptOss& t, DType dtype) {
  ModelConfig c;
  c.arch = Arch::gpt_oss;
  c.vocab_size = t.V, c.d_model = t.D, c.heads = t.H, c.kv_heads = t.KV, c.head_dim = t.hd;
  c.d_ff = t.F, c.layers = t.L, c.experts = t.E, c.moe_every = 1, c.top_k = t.k;
  c.normalize_topk = true;
  c.seq = t.max_pos;
  c.sliding_window = t.window;
  for (int64_t l = 0; l < t.L; ++l)
    if (t.sliding(l)) c.window_layers.push_back(l);
  c.rope_theta = t.theta, c.norm_eps = t.eps, c.aux_loss_coef = 0.001;
  c.rope_type = RopeType::yarn;
  c.yarn.factor = t.yarn.factor, c.yarn.original_ctx = t.yarn.original;
  c.yarn.beta_fast = t.yarn.beta_fast, c.yarn.beta_slow = t.yarn.beta_slow;
  c.yarn.truncate = t.yarn.truncate;
  c.swiglu_alpha = t.alpha, c.swiglu_limit = t.limit;
  c.dtype = dtype;
  c.resolve();
  return c;
}

// A fresh checkpoint of `mc` with every parameter random (the biases and sinks start at zero,
// which would hide a layout error); the f32 sinks hold values of the model's dtype, as an import
// gives them.
io::Checkpoint random_checkpoint(const ModelConfig& mc, uint64_t seed) {
  io::Checkpoint c = test::initial_checkpoint(mc, seed, mc.dtype);
  for (io::NamedTensor& p : c.params) {
    const Tensor r = test::random_tensor(p.shape(), ++seed, 0.5f);
    p.tensor = p.name.ends_with("attn.sinks") ? r.to(mc.dtype).to(DType::f32) : r.to(p.dtype());
  }
  return c;
}

std::vector<float> floats(const Tensor& t) { return t.to(DType::f32).to_vector(); }

// HF's expert tensors of layer `l` against our params, element by element, from the layout
// of modeling_gpt_oss.py (gate = columns ::2, up = 1::2, x @ W).
void check_expert_layout(const io::SafetensorsReader& st, const io::Checkpoint& c, int64_t l,
                         int64_t E, int64_t D, int64_t F) {
  const std::string hf = str("model.layers.", l, ".mlp.experts."), ours = str("blocks.", l, ".moe.experts.");
  const std::vector<float> gu = floats(st.read(hf + "gate_up_proj"));
  const std::vector<float> gub = floats(st.read(hf + "gate_up_proj_bias"));
  const std::vector<float> dn = floats(st.read(hf + "down_proj"));
  const std::vector<float> w1 = floats(param(c, ours + "w1").tensor);
  const std::vector<float> w3 = floats(param(c, ours + "w3").tensor);
  const std::vector<float> w2 = floats(param(c, ours + "w2").tensor);
  const std::vector<float> b1 = floats(param(c, ours + "b1").tensor);
  const std::vector<float> b3 = floats(param(c, ours + "b3").tensor);
  int64_t wrong = 0;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t f = 0; f < F; ++f) {
      wrong += gub[size_t(e * 2 * F + 2 * f)] != b1[size_t(e * F + f)];
      wrong += gub[size_t(e * 2 * F + 2 * f + 1)] != b3[size_t(e * F + f)];
      for (int64_t d = 0; d < D; ++d) {
        const size_t at = size_t((e * D + d) * 2 * F + 2 * f), ours_at = size_t((e * F + f) * D + d);
        wrong += gu[at] != w1[ours_at];
        wrong += gu[at + 1] != w3[ours_at];
        wrong += dn[size_t((e * F + f) * D + d)] != w2[size_t((e * D + d) * F + f)];
      }
    }
  CHECK(wrong == 0);
  CHECK(same_bytes(st.read(hf + "down_proj_bias"), param(c, ours + "b2").tensor));
}

}  // namespace

TEST_CASE("gpt_oss export-hf: transformers' names, shapes, dtypes, layout and config",
          "[hf][gpt_oss]") {
  test::ScratchDir dir("hf-export-gpt-oss");
  TinyGptOss t;
  t.layer_types = {"sliding_attention", "full_attention", "sliding_attention"};
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dtype));
    const ModelConfig mc = model_of(t, dtype);
    const io::Checkpoint c = random_checkpoint(mc, 7);
    const std::string out = dir.file(str("out-", dtype_name(dtype)));
    io::export_hf(c, out);
    io::SafetensorsReader st(out + "/model.safetensors");
    // Every tensor the writer's GptOssForCausalLM has, with its shape and dtype, and no other.
    const std::map<std::string, Tensor> writer = gpt_oss_weights(t, 1, dtype);
    REQUIRE(st.tensors().size() == writer.size());
    for (const auto& [name, tensor] : writer) {
      INFO("tensor " << name);
      const Tensor ours = st.read(name);
      CHECK(ours.shape() == tensor.shape());
      CHECK(ours.dtype() == tensor.dtype());  // norms F32 in bf16 too
    }
    for (int64_t l = 0; l < t.L; ++l) {
      INFO("layer " << l);
      const std::string hf = str("model.layers.", l, "."), ours = str("blocks.", l, ".");
      for (const char* p : {"q", "k", "v", "o"})
        for (const char* kind : {"weight", "bias"})
          CHECK(same_bytes(st.read(str(hf, "self_attn.", p, "_proj.", kind)),
                           param(c, str(ours, "attn.", p, ".", kind)).tensor));
      CHECK(same_bytes(st.read(hf + "self_attn.sinks"),
                       param(c, ours + "attn.sinks").tensor.to(dtype)));
      CHECK(same_bytes(st.read(hf + "mlp.router.weight"),
                       param(c, ours + "moe.router.weight").tensor));
      CHECK(same_bytes(st.read(hf + "mlp.router.bias"),
                       param(c, ours + "moe.router.logit_bias").tensor));
      CHECK(same_bytes(st.read(hf + "input_layernorm.weight"),
                       param(c, ours + "norm1.weight").tensor.to(DType::f32)));
      CHECK(same_bytes(st.read(hf + "post_attention_layernorm.weight"),
                       param(c, ours + "norm2.weight").tensor.to(DType::f32)));
      check_expert_layout(st, c, l, t.E, t.D, t.F);
    }
    CHECK(same_bytes(st.read("model.norm.weight"),
                     param(c, "final_norm.weight").tensor.to(DType::f32)));
    CHECK(same_bytes(st.read("lm_head.weight"), param(c, "lm_head.weight").tensor));
    // config.json: the writer's keys and values for the same model.
    json want = gpt_oss_config(t);
    want["torch_dtype"] = dtype == DType::f32 ? "float32" : "bfloat16";
    const json got = config_of(out);
    for (const auto& [key, value] : want.items()) {
      INFO("config key " << key);
      REQUIRE(got.contains(key));
      CHECK(got[key] == value);
    }
    for (const auto& [key, value] : got.items()) {
      INFO("config key " << key);
      CHECK(want.contains(key));
    }
  }
}

TEST_CASE("gpt_oss export-hf: without a window or YaRN the config says so", "[hf][gpt_oss]") {
  test::ScratchDir dir("hf-export-gpt-oss-plain");
  TinyGptOss t;
  ModelConfig mc = model_of(t, DType::f32);
  mc.sliding_window = 0, mc.window_layers.clear();
  mc.rope_type = RopeType::none, mc.yarn = {};
  mc.resolve();
  io::export_hf(random_checkpoint(mc, 3), dir.file("out"));
  const json c = config_of(dir.file("out"));
  CHECK(c["sliding_window"].is_null());
  CHECK(c["layer_types"] == json(std::vector<std::string>(3, "full_attention")));
  // An absent rope_parameters would mean GptOssConfig's YaRN default: "default" is written.
  CHECK(c["rope_parameters"] == json{{"rope_type", "default"}, {"rope_theta", t.theta}});
  // Every layer sliding (window_layers empty).
  mc.sliding_window = 6;
  mc.resolve();
  io::export_hf(random_checkpoint(mc, 3), dir.file("every"));
  const json every = config_of(dir.file("every"));
  CHECK(every["sliding_window"] == 6);
  CHECK(every["layer_types"] == json(std::vector<std::string>(3, "sliding_attention")));
}

TEST_CASE("gpt_oss export-hf: a lazily opened checkpoint gives the same bytes", "[hf][gpt_oss]") {
  test::ScratchDir dir("hf-export-gpt-oss-lazy");
  const ModelConfig mc = model_of(TinyGptOss{}, DType::bf16);
  const io::Checkpoint held = random_checkpoint(mc, 11);
  io::save_checkpoint(dir.file("model.h5"), held);
  const io::Checkpoint lazy = io::open_checkpoint_lazy(dir.file("model.h5"), false);
  io::export_hf(held, dir.file("held"));
  io::export_hf(lazy, dir.file("lazy"), {.max_shard_bytes = 100000});  // shards too
  io::SafetensorsReader a(dir.file("held/model.safetensors"));
  const json index = json::parse(test::read_file(dir.file("lazy/model.safetensors.index.json")));
  REQUIRE(index["weight_map"].size() == a.tensors().size());
  int64_t checked = 0;
  for (const io::SafetensorsEntry& e : a.tensors()) {
    INFO("tensor " << e.name);
    io::SafetensorsReader b(dir.file("lazy/" + index["weight_map"][e.name].get<std::string>()));
    CHECK(same_bytes(a.read(e.name), b.read(e.name)));
    ++checked;
  }
  CHECK(checked == 3 * 17 + 3);
}

TEST_CASE("gpt_oss export-hf: what HF GptOss cannot hold is refused by name", "[hf][gpt_oss]") {
  test::ScratchDir dir("hf-export-gpt-oss-refused");
  ModelConfig mc = model_of(TinyGptOss{}, DType::f32);
  mc.normalize_topk = false;
  CHECK_THAT(test::error_of([&] { io::export_hf(random_checkpoint(mc, 5), dir.file("a")); }),
             Catch::Contains("HF GptOss") && Catch::Contains("normalize_topk false"));
  CHECK_FALSE(std::filesystem::exists(dir.file("a")));
  // Quantised checkpoints: only gpt-oss's MXFP4 experts, all of them, have an HF form.
  mc.normalize_topk = true;
  io::Checkpoint q8 = random_checkpoint(mc, 5);
  q8.model_config[io::kQuantizationKey] = "q8_0";
  CHECK_THAT(test::error_of([&] { io::export_hf(q8, dir.file("b")); }),
             Catch::Contains("q8_0-quantised") &&
                 Catch::Contains("only gpt-oss's MXFP4 experts have a Hugging Face form"));
  io::Checkpoint some = random_checkpoint(mc, 5);
  some.model_config[io::kQuantizationKey] = "mxfp4";
  some.model_config[io::kTensorFormatsKey] = {{"blocks.0.moe.experts.w1", "mxfp4"}};
  CHECK_THAT(test::error_of([&] { io::export_hf(some, dir.file("b")); }),
             Catch::Contains("every expert matrix in MXFP4 or none"));
  CHECK_FALSE(std::filesystem::exists(dir.file("b")));
}

namespace {

// Input k of one of our mxfp4 rows (GGUF's MXFP4 blocks of 32 inputs: the E8M0 scale byte, then
// 16 bytes, byte j holding input j in its low nibble and input j + 16 in its high one), as f32.
float our_mxfp4_input(const uint8_t* row, int64_t k) {
  const uint8_t* block = row + (k / 32) * 17;
  const int64_t j = k % 32;
  const int code = j < 16 ? block[1 + j] & 15 : block[1 + j - 16] >> 4;
  return float(fp4_value(code) * std::ldexp(1.0, int(block[0]) - 127));
}

bool same_float(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("gpt_oss export-hf: kept MXFP4 experts go out as _blocks and _scales, bit-exact",
          "[hf][gpt_oss][mxfp4]") {
  test::ScratchDir dir("hf-export-gpt-oss-mxfp4");
  TinyGptOss t;
  t.layer_types = {"sliding_attention", "full_attention", "sliding_attention"};
  const ModelConfig mc = model_of(t, DType::bf16);
  io::Checkpoint c = random_checkpoint(mc, 9);
  json formats = json::object();
  uint64_t seed = 100;
  for (io::NamedTensor& p : c.params) {
    const bool w2 = p.name.ends_with("moe.experts.w2");
    if (!w2 && !p.name.ends_with("moe.experts.w1") && !p.name.ends_with("moe.experts.w3")) continue;
    const int64_t rows = w2 ? t.D : t.F, in = w2 ? t.F : t.D;
    auto [blocks, scales] = random_mxfp4(t.E, rows, in, ++seed);  // any bytes, scales 120..126
    Tensor kept = Tensor::empty({t.E, rows, in / 32 * 17}, DType::u8);
    for (int64_t b = 0; b < t.E * rows * (in / 32); ++b) {
      kept.data<uint8_t>()[b * 17] = scales.data<uint8_t>()[b];
      std::memcpy(kept.data<uint8_t>() + b * 17 + 1, blocks.data<uint8_t>() + b * 16, 16);
    }
    p.tensor = kept;
    formats[p.name] = "mxfp4";
  }
  REQUIRE(formats.size() == size_t(3 * t.L));
  c.model_config[io::kQuantizationKey] = "mxfp4";
  c.model_config[io::kTensorFormatsKey] = formats;
  io::export_hf(c, dir.file("out"));
  io::SafetensorsReader st(dir.file("out/model.safetensors"));
  REQUIRE(st.tensors().size() == gpt_oss_mxfp4(t, 1).size());
  for (const auto& [name, tensor] : gpt_oss_mxfp4(t, 1)) {  // the writer's names, shapes, dtypes
    INFO("tensor " << name);
    const Tensor ours = st.read(name);
    CHECK(ours.shape() == tensor.shape());
    CHECK(ours.dtype() == tensor.dtype());
  }
  // Decoded with the test's HF dequantiser (transformers' layout), every input of every row is
  // our block's input, bit for bit (signed zeros included).
  for (int64_t l = 0; l < t.L; ++l) {
    INFO("layer " << l);
    const std::string hf = str("model.layers.", l, ".mlp.experts."), x = str("blocks.", l, ".moe.experts.");
    const std::vector<float> gu =
        hf_mxfp4_dequantize(st.read(hf + "gate_up_proj_blocks"), st.read(hf + "gate_up_proj_scales"),
                            DType::f32)
            .to_vector();
    const std::vector<float> dn =
        hf_mxfp4_dequantize(st.read(hf + "down_proj_blocks"), st.read(hf + "down_proj_scales"),
                            DType::f32)
            .to_vector();
    const uint8_t* w1 = param(c, x + "w1").tensor.data<uint8_t>();
    const uint8_t* w3 = param(c, x + "w3").tensor.data<uint8_t>();
    const uint8_t* w2 = param(c, x + "w2").tensor.data<uint8_t>();
    const int64_t D = t.D, F = t.F, rowD = D / 32 * 17, rowF = F / 32 * 17;
    int64_t wrong = 0;
    for (int64_t e = 0; e < t.E; ++e)
      for (int64_t f = 0; f < F; ++f)
        for (int64_t d = 0; d < D; ++d) {
          const size_t g = size_t((e * D + d) * 2 * F + 2 * f);
          wrong += !same_float(gu[g], our_mxfp4_input(w1 + (e * F + f) * rowD, d));
          wrong += !same_float(gu[g + 1], our_mxfp4_input(w3 + (e * F + f) * rowD, d));
          wrong += !same_float(dn[size_t((e * F + f) * D + d)],
                               our_mxfp4_input(w2 + (e * D + d) * rowF, f));
        }
    CHECK(wrong == 0);
  }
  const json config = config_of(dir.file("out"));
  CHECK(config["quantization_config"] == gpt_oss_mxfp4_config(t)["quantization_config"]);
  CHECK(config["torch_dtype"] == "bfloat16");
}

TEST_CASE("gpt_oss: HF directory -> import-hf -> export-hf is tensor- and config-identical",
          "[hf][gpt_oss]") {
  test::ScratchDir dir("hf-export-gpt-oss-round");
  for (bool defaults : {false, true})
    for (DType dtype : {DType::f32, DType::bf16}) {
      INFO(dtype_name(dtype) << (defaults ? ", layer_types and rope_parameters absent" : ""));
      TinyGptOss t;
      if (!defaults) t.layer_types = {"sliding_attention", "full_attention", "sliding_attention"};
      t.write_rope = !defaults;
      const std::map<std::string, Tensor> w = gpt_oss_weights(t, 21, dtype);  // norms F32
      json source_config = gpt_oss_config(t);
      source_config["torch_dtype"] = dtype == DType::f32 ? "float32" : "bfloat16";
      const std::string src = dir.file(str("src-", dtype_name(dtype), defaults ? "-defaults" : ""));
      write_hf_dir(src, source_config, w, 2);
      const io::Checkpoint imported = test::import_hf_held(src);
      CHECK(model_config_from_json(imported.model_config).dtype == dtype);
      const std::string out = src + "-out";
      io::export_hf(imported, out);
      io::SafetensorsReader st(out + "/model.safetensors");
      REQUIRE(st.tensors().size() == w.size());
      for (const auto& [name, tensor] : w) {
        INFO("tensor " << name);
        REQUIRE(same_bytes(st.read(name), tensor));
      }
      const json c = config_of(out);
      for (const auto& [key, value] : source_config.items()) {
        INFO("config key " << key);
        REQUIRE(c.contains(key));
        CHECK(c[key] == value);
      }
      if (defaults) {  // GptOssConfig's defaults, written out
        CHECK(c["layer_types"] ==
              json({"sliding_attention", "full_attention", "sliding_attention"}));
        test::YarnRef released = t.yarn;  // GptOssConfig's dict: 4096 positions
        released.original = 4096;
        json rope = yarn_config(released);
        rope["truncate"] = false;
        rope["rope_theta"] = t.theta;
        CHECK(c["rope_parameters"] == rope);
      }
      // The export imports as the same model, which scores the same, bit for bit.
      const io::Checkpoint again = test::import_hf_held(out);
      require_same_params(imported, again);
      CHECK(again.model_config == imported.model_config);
      const int64_t B = 2, T = 12;
      const std::vector<int32_t> ids = random_token_ids(B * T, int32_t(t.V), 5);
      const std::vector<float> a = our_logits(imported, src + ".h5", ids, B, T);
      const std::vector<float> b = our_logits(again, out + ".h5", ids, B, T);
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("gpt_oss export-hf: a tied head and an odd sliding layer come back", "[hf][gpt_oss]") {
  test::ScratchDir dir("hf-export-gpt-oss-tied");
  TinyGptOss t;
  ModelConfig mc = model_of(t, DType::bf16);
  mc.window_layers = {1};  // not GptOssConfig's default: layer_types must say it
  mc.tie_embeddings = true;
  mc.resolve();
  const io::Checkpoint c = random_checkpoint(mc, 13);
  io::export_hf(c, dir.file("out"));
  const json config = config_of(dir.file("out"));
  CHECK(config["tie_word_embeddings"] == true);
  CHECK(config["layer_types"] == json({"full_attention", "sliding_attention", "full_attention"}));
  io::SafetensorsReader st(dir.file("out/model.safetensors"));
  CHECK(st.find("lm_head.weight") == nullptr);  // transformers ties it to embed_tokens on load
  // The same params by name (import-hf orders a layer's q/k/v/o weights before their biases,
  // our model each weight with its bias).
  const io::Checkpoint again = test::import_hf_held(dir.file("out"));
  REQUIRE(again.params.size() == c.params.size());
  for (const io::NamedTensor& p : c.params) {
    INFO("parameter " << p.name);
    CHECK(same_bytes(param(again, p.name).tensor, p.tensor));
  }
  const ModelConfig back = model_config_from_json(again.model_config);
  CHECK(back.window_layers == std::vector<int64_t>{1});
  CHECK(back.tie_embeddings);
}
