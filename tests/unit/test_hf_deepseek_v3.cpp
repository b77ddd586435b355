// DeepSeek-V3 (deepseek_v3) through import-hf (issue 44): a transformers-format directory written
// by tests/support/hf_deepseek_v3_model.h imports with the family's config, scores within 1e-4
// per window of the double reference written from the published math (latent attention with
// DeepSeek's interleaved RoPE, GLM-4-MoE's router and experts), skips the multi-token-prediction
// layer with a note, exports back tensor-identical, and refuses what we cannot represent by name.
#include <catch2/catch.hpp>

#include "moe/io/gguf.h"
#include "moe/io/safetensors.h"
#include "support/hf_deepseek_v3_model.h"
#include "support/run.h"

using namespace moe;
using namespace moe::test::hf;

namespace {

// Per window our f32 logits within 1e-4 of the reference, relative to their scale.
void require_scores_like_reference(const TinyDeepseek& t, const std::string& src, uint64_t seed) {
  const int64_t B = 2, T = 9;
  const auto w = deepseek_weights(t, seed);
  write_hf_dir(src, t.v2 ? deepseek_v2_config(t) : deepseek_config(t), w, 2);
  const io::Checkpoint ckpt = test::import_hf_held(src);
  const auto ids = random_token_ids(B * T, int32_t(t.moe.V), seed + 1);
  const std::vector<float> ours = our_logits(ckpt, src + ".h5", ids, B, T);
  const Vec reference = deepseek_reference_logits(t, w, ids, B, T);
  for (int64_t b = 0; b < B; ++b) {
    const size_t n = size_t(T * t.moe.V), at = size_t(b) * n;
    const std::vector<float> mine(ours.begin() + long(at), ours.begin() + long(at + n));
    const Vec want(reference.begin() + long(at), reference.begin() + long(at + n));
    const double error = relative_error(mine, want);
    INFO("window " << b << ": relative error " << error);
    REQUIRE(error < 1e-4);
  }
}

}  // namespace

TEST_CASE("deepseek_v3: import-hf reads the family's config", "[hf][deepseek_v3]") {
  test::ScratchDir dir("deepseek-v3-import");
  const TinyDeepseek t;
  write_hf_dir(dir.file("ds"), deepseek_config(t), deepseek_weights(t, 5), 1);
  io::HfImportReport report;
  const io::Checkpoint ckpt = test::import_hf_held(dir.file("ds"), {}, &report);
  const ModelConfig mc = model_config_from_json(ckpt.model_config);
  REQUIRE(mc.arch == Arch::deepseek_v3);
  CHECK(mc.q_lora_rank == t.attn.r);
  CHECK(mc.kv_lora_rank == t.attn.c);
  CHECK(mc.qk_nope_dim == t.attn.dn);
  CHECK(mc.qk_rope_dim == t.attn.dr);
  CHECK(mc.v_head_dim == t.attn.dv);
  CHECK(mc.kv_heads_resolved() == t.moe.H);  // num_key_value_heads 128 is not read
  CHECK(mc.experts_per_layer == std::vector<int64_t>{0, t.moe.E, t.moe.E});
  CHECK(mc.dense_ff_resolved() == t.moe.Fd);
  CHECK(mc.shared_expert_ff == t.moe.F);
  CHECK(mc.router_scoring == nn::RouterScoring::sigmoid);
  CHECK(mc.router_groups == t.moe.groups);
  CHECK(mc.router_group_topk == t.moe.group_k);
  CHECK(mc.routed_scale == t.moe.scale);
  CHECK(mc.normalize_topk);
  CHECK(report.unmapped.empty());
  bool noted = false;
  for (const std::string& note : report.notes)
    noted = noted || note.find("multi-token-prediction layers (3..3") != std::string::npos;
  CHECK(noted);
  // kv_a_proj_with_mqa's first kv_lora_rank rows are our kv_a, unchanged.
  const Tensor kv_a =
      deepseek_weights(t, 5).at("model.layers.1.self_attn.kv_a_proj_with_mqa.weight");
  CHECK(same_bytes(param(ckpt, "blocks.1.attn.kv_a.weight").tensor, kv_a.rows(0, t.attn.c)));
  CHECK(param(ckpt, "blocks.1.attn.k_rope.weight").tensor.shape() == Shape{t.attn.dr, t.moe.D});
}

TEST_CASE("deepseek_v3: an imported model scores like the reference", "[hf][deepseek_v3]") {
  test::ScratchDir dir("deepseek-v3-score");
  SECTION("DeepSeek-V3 shape: q latent, groups, values narrower than keys") {
    require_scores_like_reference(TinyDeepseek{}, dir.file("a"), 11);
  }
  SECTION("DeepSeek-V2-Lite's attention: plain q_proj, values as wide as keys") {
    TinyDeepseek t;
    t.attn.r = 0, t.attn.dv = 8, t.moe.groups = 1, t.moe.group_k = 1, t.moe.shared = 2;
    require_scores_like_reference(t, dir.file("b"), 12);
  }
  SECTION("DeepSeek-V2: softmax router, scaled, not renormalised; two shared experts") {
    TinyDeepseek t;
    t.v2 = true, t.nextn = 0, t.moe.dense = 1, t.moe.shared = 2, t.moe.scale = 1.7;
    require_scores_like_reference(t, dir.file("v2"), 14);
  }
  SECTION("YaRN: ramped frequencies, attention factor, DeepSeek's softmax mscale") {
    // 8 rotated features (4 pairs), theta 50, factor 4 over 64 original positions: the ramp runs
    // over pairs 0..3 (r = 0, 1/3, 2/3, 1); mscale 0.8 / mscale_all_dim 1.2 make the attention
    // factor m(0.8) / m(1.2) = 0.952 and the softmax scale m(1.2)^2 = 1.360 times 1/sqrt(hd):
    // each of the three is off by more than the tolerance if it is dropped.
    TinyDeepseek t;
    t.attn.dr = 8, t.nextn = 0;
    t.attn.yarn = {4.0, 64.0, 32.0, 1.0, 0.8, 1.2};
    t.moe.max_pos = 256;
    require_scores_like_reference(t, dir.file("yarn"), 15);
    SECTION("and on halves, with a plain q_proj") {
      t.interleave = false, t.attn.interleaved = false, t.attn.r = 0;
      require_scores_like_reference(t, dir.file("yarn-halves"), 16);
    }
  }
  SECTION("rope_interleave false: RoPE on halves") {
    TinyDeepseek t;
    t.interleave = false, t.attn.interleaved = false, t.nextn = 0;
    require_scores_like_reference(t, dir.file("c"), 13);
  }
}

TEST_CASE("deepseek_v3: import-hf reads DeepSeek-V2's router", "[hf][deepseek_v3]") {
  test::ScratchDir dir("deepseek-v2-import");
  TinyDeepseek t;
  t.v2 = true, t.nextn = 0;
  write_hf_dir(dir.file("v2"), deepseek_v2_config(t), deepseek_weights(t, 5), 1);
  const io::Checkpoint ckpt = test::import_hf_held(dir.file("v2"));
  const ModelConfig mc = model_config_from_json(ckpt.model_config);
  CHECK(mc.arch == Arch::deepseek_v3);
  CHECK(mc.router_scoring == nn::RouterScoring::softmax);
  CHECK_FALSE(mc.normalize_topk);
  CHECK(mc.router_groups == 1);
  CHECK(mc.routed_scale == t.moe.scale);
  CHECK(mc.kv_lora_rank == t.attn.c);
  for (const io::NamedTensor& nt : ckpt.params)
    CHECK(nt.name.find("router.bias") == std::string::npos);
  // export-hf writes it back as DeepSeek-V2 (test_hf_deepseek_v2_export.cpp).
  io::export_hf(ckpt, dir.file("out"));
  CHECK(json::parse(test::read_file(dir.file("out") + "/config.json"))["model_type"] ==
        "deepseek_v2");
  json renorm = deepseek_v2_config(t);
  renorm["norm_topk_prob"] = true;
  write_hf_dir(dir.file("renorm"), renorm, deepseek_weights(t, 5), 1);
  CHECK_THAT(test::error_of([&] { test::import_hf_held(dir.file("renorm")); }),
             Catch::Contains("norm_topk_prob true (transformers' DeepSeek-V2 never renormalises)"));
}

TEST_CASE("deepseek_v3: what we cannot represent is refused by name", "[hf][deepseek_v3]") {
  test::ScratchDir dir("deepseek-v3-refuse");
  const TinyDeepseek t;
  auto refusal = [&](const std::string& name, const json& config) {
    write_hf_dir(dir.file(name), config, deepseek_weights(t, 6), 1);
    return test::error_of([&] { test::import_hf_held(dir.file(name)); });
  };
  json dynamic = deepseek_config(t);  // YaRN imports; the other scalings are refused by name
  dynamic["rope_scaling"] = {{"type", "dynamic"}, {"factor", 4}};
  CHECK_THAT(refusal("dynamic", dynamic),
             Catch::Contains("RoPE scaling (rope_scaling type 'dynamic')"));
  json no_factor = deepseek_config(t);
  no_factor["rope_scaling"] = {{"type", "yarn"}, {"mscale", 1.0}};
  CHECK_THAT(refusal("no-factor", no_factor), Catch::Contains("YaRN needs \"factor\""));
  json narrow = deepseek_config(t);  // betas whose range is empty: no ramp to build
  narrow["rope_parameters"] = {{"rope_type", "yarn"},
                               {"rope_theta", 50},
                               {"factor", 4},
                               {"beta_fast", 1},
                               {"beta_slow", 32},
                               {"mscale", 1.0},
                               {"original_max_position_embeddings", 64}};
  CHECK_THAT(refusal("narrow", narrow), Catch::Contains("YaRN"));
  json shrink = deepseek_config(t);  // a factor below 1: named by the file, the flag and the key
  shrink["rope_scaling"] = {{"type", "yarn"}, {"factor", 0.5}};
  CHECK_THAT(refusal("shrink", shrink),
             Catch::Contains("config.json': not a model we can build: --rope-factor must be >= 1 "
                             "(got 0.5): YaRN's \"factor\", as an HF config names it"));
  json freq = deepseek_config(t);
  freq["moe_layer_freq"] = 2;
  CHECK_THAT(refusal("freq", freq), Catch::Contains("moe_layer_freq"));
  json odd = deepseek_config(t);
  odd["qk_rope_head_dim"] = 3;
  CHECK_THAT(refusal("odd", odd), Catch::Contains("\"qk_rope_head_dim\" is 3: RoPE rotates pairs"));
  json grouped = deepseek_config(t);  // DeepSeek-V2's groups score by their best expert
  grouped["model_type"] = "deepseek_v2";
  grouped["topk_method"] = "group_limited_greedy";
  CHECK_THAT(refusal("grouped", grouped),
             Catch::Contains("topk_method 'group_limited_greedy' choosing 2 of 4 groups"));
}

TEST_CASE("deepseek_v3: import -> export -> import is tensor-identical, f32 and bf16",
          "[hf][deepseek_v3]") {
  test::ScratchDir dir("deepseek-v3-export");
  for (bool plain_q : {false, true}) {
    TinyDeepseek t;
    t.nextn = 0;  // the export has no multi-token-prediction layer to write
    if (plain_q) t.attn.r = 0;
    for (DType dtype : {DType::f32, DType::bf16}) {
      INFO(dtype_name(dtype) << (plain_q ? ", plain q_proj" : ", q latent"));
      std::map<std::string, Tensor> w;
      for (const auto& [name, tensor] : deepseek_weights(t, 7))  // the bias stays f32
        w[name] = name.ends_with("e_score_correction_bias") ? tensor : tensor.to(dtype);
      const std::string src = dir.file(str("ds-", dtype_name(dtype), plain_q ? "-plain" : ""));
      write_hf_dir(src, deepseek_config(t), w, 2);
      const io::Checkpoint imported = test::import_hf_held(src);
      REQUIRE(model_config_from_json(imported.model_config).dtype == dtype);
      const std::string out = src + "-out";
      io::export_hf(imported, out);
      io::SafetensorsReader st(out + "/model.safetensors");
      for (const auto& [name, tensor] : w) {
        INFO("tensor " << name);
        REQUIRE(same_bytes(st.read(name), tensor));
      }
      REQUIRE(st.tensors().size() == w.size());
      const json c = json::parse(test::read_file(out + "/config.json"));
      const json want = deepseek_config(t);
      for (const auto& [key, value] : want.items()) {
        INFO("config key " << key);
        if (key != "dtype" && key != "num_key_value_heads" && key != "qk_head_dim")
          REQUIRE(c[key] == value);
      }
      const io::Checkpoint again = test::import_hf_held(out);
      require_same_params(imported, again);
      REQUIRE(again.model_config == imported.model_config);
    }
  }
  // (llama.cpp's deepseek2: test_gguf_deepseek2.cpp.)
}

TEST_CASE("deepseek_v3: YaRN exports back config- and tensor-identical",
          "[hf][deepseek_v3][yarn]") {
  test::ScratchDir dir("deepseek-v3-yarn-export");
  TinyDeepseek t;
  t.nextn = 0, t.attn.dr = 8;
  t.attn.yarn = {40.0, 64.0, 32.0, 1.0, 1.0, 1.0};  // DeepSeek-V3's own settings, a small context
  const auto w = deepseek_weights(t, 8);
  write_hf_dir(dir.file("src"), deepseek_config(t), w, 1);
  const io::Checkpoint imported = test::import_hf_held(dir.file("src"));
  const ModelConfig mc = model_config_from_json(imported.model_config);
  REQUIRE(mc.rope_type == RopeType::yarn);
  CHECK(mc.yarn.factor == 40);
  CHECK(mc.yarn.original_ctx == 64);
  CHECK(mc.yarn.mscale_all_dim == 1);
  CHECK(mc.attention_scale() == Approx(t.attn.yarn.score_gain()));  // m(1)^2 = 1.874
  CHECK(mc.rope_scaling().attention_factor == 1.0f);                // mscale = mscale_all_dim
  io::export_hf(imported, dir.file("out"));
  io::SafetensorsReader st(dir.file("out") + "/model.safetensors");
  for (const auto& [name, tensor] : w) {
    INFO("tensor " << name);
    REQUIRE(same_bytes(st.read(name), tensor));
  }
  const json c = json::parse(test::read_file(dir.file("out") + "/config.json"));
  CHECK(c["rope_parameters"] == deepseek_config(t)["rope_parameters"]);
  const io::Checkpoint again = test::import_hf_held(dir.file("out"));
  require_same_params(imported, again);
  REQUIRE(again.model_config == imported.model_config);
}

TEST_CASE("deepseek_v3: DeepSeek-V2's YaRN under rope_scaling's older 'type' key",
          "[hf][deepseek_v3][yarn]") {
  // DeepSeek-V2's released config (transformers 4 spelling): rope_scaling {"type": "yarn",
  // factor 40, original 4096, betas 32 / 1, mscale = mscale_all_dim = 0.707}.
  test::ScratchDir dir("deepseek-v2-yarn");
  TinyDeepseek t;
  t.v2 = true, t.nextn = 0;
  json c = deepseek_v2_config(t);
  c["rope_scaling"] = {{"type", "yarn"},
                       {"factor", 40},
                       {"beta_fast", 32},
                       {"beta_slow", 1},
                       {"mscale", 0.707},
                       {"mscale_all_dim", 0.707},
                       {"original_max_position_embeddings", 4096}};
  write_hf_dir(dir.file("v2"), c, deepseek_weights(t, 5), 1);
  const ModelConfig mc = model_config_from_json(test::import_hf_held(dir.file("v2")).model_config);
  REQUIRE(mc.rope_type == RopeType::yarn);
  CHECK(mc.yarn.factor == 40);
  CHECK(mc.yarn.original_ctx == 4096);
  CHECK(mc.yarn.mscale == 0.707);
  CHECK(mc.rope_scaling().attention_factor == 1.0f);  // m(0.707) / m(0.707)
  // The softmax factor (0.0707 ln 40 + 1)^2 = 1.5544 (transformers' yarn_apply_mscale).
  CHECK(mc.attention_scale() == Approx(std::pow(0.0707 * std::log(40.0) + 1.0, 2)));
}
