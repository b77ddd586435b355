// YaRN RoPE in the families beside DeepSeek (issue 44): a Mixtral and a Qwen3-MoE directory
// (support/hf_families.h) whose rope_scaling is "yarn" import and score within 1e-4 per window of
// the double reference (support/yarn_reference.h: ramped frequencies and the attention factor on
// cos/sin, no softmax factor outside DeepSeek), gpt-oss's keys (factor 32, betas 32 / 1,
// truncate false) included; export-hf writes rope_scaling back config-identical; export-gguf
// writes llama.cpp's rope.scaling.* keys (import-gguf reads them back) or refuses by name what
// llama.cpp would not apply.
#include <catch2/catch.hpp>

#include "moe/io/gguf.h"
#include "moe/io/gguf_import.h"
#include "support/hf_families.h"

using namespace moe;
using namespace moe::test::hf;

namespace {

// The tiny family model with YaRN over 4096 original positions at theta 10000: with hd 8 the
// range runs over pairs 1.31 .. 2.81 (truncate false) or 1 .. 3 (true), so the pairs cover each
// region; the attention factor is 0.1 ln(factor) + 1.
Tiny yarn_tiny(const std::string& family, double factor, bool truncate) {
  Tiny t = tiny_of(family);
  t.yarn.factor = factor, t.yarn.original = 4096, t.yarn.truncate = truncate;
  t.max_pos = 64;
  return t;
}

void require_scores_like_reference(const Tiny& t, const std::string& src, uint64_t seed) {
  const int64_t B = 2, T = 12;
  const auto w = family_weights(t, seed);
  write_hf_dir(src, family_config(t), w, 1);
  const io::Checkpoint ckpt = test::import_hf_held(src);
  const ModelConfig mc = model_config_from_json(ckpt.model_config);
  REQUIRE(mc.rope_type == RopeType::yarn);
  REQUIRE(mc.attention_scale() == 1.0);  // DeepSeek's softmax factor only
  const auto ids = random_token_ids(B * T, int32_t(t.V), seed + 1);
  const std::vector<float> ours = our_logits(ckpt, src + ".h5", ids, B, T);
  const Vec want = hf_reference_logits(t, w, ids, B, T, t.norm_topk);
  Tiny plain = t;
  plain.yarn = {};
  const Vec without = hf_reference_logits(plain, w, ids, B, T, t.norm_topk);
  for (int64_t b = 0; b < B; ++b) {
    const size_t n = size_t(T * t.V), at = size_t(b) * n;
    const std::vector<float> mine(ours.begin() + long(at), ours.begin() + long(at + n));
    const Vec ref(want.begin() + long(at), want.begin() + long(at + n));
    INFO("window " << b);
    REQUIRE(relative_error(mine, ref) < 1e-4);
    // YaRN moves these logits by far more than the tolerance: the check above can fail.
    const Vec other(without.begin() + long(at), without.begin() + long(at + n));
    REQUIRE(relative_error(mine, other) > 1e-3);
  }
}

}  // namespace

TEST_CASE("hf yarn: Mixtral and Qwen3-MoE with YaRN score like the reference", "[hf][yarn]") {
  test::ScratchDir dir("hf-yarn-score");
  SECTION("gpt-oss's settings on a Mixtral: factor 32, truncate false") {
    require_scores_like_reference(yarn_tiny("mixtral", 32, false), dir.file("mixtral"), 21);
  }
  SECTION("Qwen3-MoE's long-context settings: factor 4, truncated range") {
    require_scores_like_reference(yarn_tiny("qwen3_moe", 4, true), dir.file("qwen3"), 22);
  }
}

TEST_CASE("hf yarn: export-hf writes rope_scaling back, export-gguf llama.cpp's keys",
          "[hf][yarn][gguf]") {
  test::ScratchDir dir("hf-yarn-export");
  const Tiny t = yarn_tiny("qwen3_moe", 4, true);
  const auto w = family_weights(t, 23);
  write_hf_dir(dir.file("src"), family_config(t), w, 1);
  const io::Checkpoint imported = test::import_hf_held(dir.file("src"));
  io::export_hf(imported, dir.file("out"));
  const json c = json::parse(test::read_file(dir.file("out") + "/config.json"));
  CHECK(c["rope_scaling"] == family_config(t)["rope_scaling"]);
  const io::Checkpoint again = test::import_hf_held(dir.file("out"));
  REQUIRE(again.model_config == imported.model_config);

  // llama.cpp's YaRN keys for the settings it applies (betas 32 / 1, truncated, derived factor).
  io::export_gguf(imported, dir.file("q3.gguf"), {io::GgufType::f32, "q3"});
  const io::GgufFile g = io::read_gguf(dir.file("q3.gguf"));
  auto key = [&](const std::string& k) {
    return g.metadata["qwen3moe.rope.scaling." + k]["value"];
  };
  CHECK(key("type") == "yarn");
  CHECK(key("factor").get<float>() == 4.0f);
  CHECK(key("original_context_length") == 4096);
  // import-gguf reads them back (and so takes the exporter's record, whose YaRN agrees).
  io::GgufImportReport report;
  const io::Checkpoint back = io::import_gguf(dir.file("q3.gguf"), {}, &report);
  const ModelConfig got = model_config_from_json(back.model_config);
  CHECK(got.rope_type == RopeType::yarn);
  CHECK(got.rope_scaling() == model_config_from_json(imported.model_config).rope_scaling());
  bool recorded = false;
  for (const std::string& note : report.notes)
    recorded = recorded || note.find("exporter's record") != std::string::npos;
  CHECK(recorded);
  // gpt-oss's truncate false is not llama.cpp's rope: refused by name.
  const Tiny oss = yarn_tiny("qwen3_moe", 32, false);
  write_hf_dir(dir.file("oss"), family_config(oss), family_weights(oss, 24), 1);
  const io::Checkpoint untruncated = test::import_hf_held(dir.file("oss"));
  CHECK_THAT(test::error_of([&] { io::export_gguf(untruncated, dir.file("oss.gguf"), {}); }),
             Catch::Contains("this model's YaRN sets truncate false"));
}
