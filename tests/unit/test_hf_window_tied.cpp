// Issue 44: sliding-window attention and tied word embeddings in the HF families. Directories
// written as transformers 5.25's classes write them (tests/support/hf_families.h) import, score
// within 1e-4 of the double reference with the window (the reference masks keys s - window < u
// <= s, transformers' masking_utils.sliding_window_overlay), export back with the same keys and
// tensors, and a tied model has no lm_head anywhere (HF, GGUF). What a format cannot say is
// refused by name.
// Shape letters: V vocabulary, D hidden, L layers, T sequence.
#include <catch2/catch.hpp>
#include <fstream>

#include "moe/io/gguf.h"
#include "moe/io/gguf_import.h"
#include "support/hf_families.h"

using namespace moe;
using namespace moe::test::hf;

namespace {

// A directory's config.json, parsed.
json config_of(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  return json::parse(in);
}

bool has_param(const io::Checkpoint& c, const std::string& name) {
  for (const auto& p : c.params)
    if (p.name == name) return true;
  return false;
}

// Imports `config` + `w`, checks our logits against the reference within 1e-4 relative (f32
// logits of O(1-10) through 2-3 layers: ~1e-6 seen), and that the window matters: the reference
// without it is further than 1e-3 away. Returns the import.
io::Checkpoint import_and_score(test::ScratchDir& dir, const std::string& name, const json& config,
                                const std::map<std::string, Tensor>& w, const Tiny& t) {
  write_hf_dir(dir.file(name), config, w, 1);
  const io::Checkpoint c = test::import_hf_held(dir.file(name));
  const int64_t B = 2, T = 14;
  const std::vector<int32_t> ids = random_token_ids(B * T, int32_t(t.V), 44);
  const std::vector<float> ours = our_logits(c, dir.file(name + ".h5"), ids, B, T);
  const Vec want = hf_reference_logits(t, w, ids, B, T, t.norm_topk);
  CHECK(relative_error(ours, want) < 1e-4);
  Tiny full = t;
  full.window = 0;
  if (t.window > 0)
    CHECK(relative_gap(hf_reference_logits(full, w, ids, B, T, t.norm_topk), want) > 1e-3);
  return c;
}

// export_hf then import_hf: the config.json keys `keys` as given, the tensors and model config
// back as they were.
void round_trip(test::ScratchDir& dir, const std::string& name, const io::Checkpoint& c,
                const json& keys) {
  io::export_hf(c, dir.file(name + "-out"));
  const json written = config_of(dir.file(name + "-out"));
  for (const auto& [key, value] : keys.items()) {
    INFO("config.json key " << key);
    CHECK(written.at(key) == value);
  }
  const io::Checkpoint again = test::import_hf_held(dir.file(name + "-out"));
  require_same_params(c, again);
  CHECK(again.model_config == c.model_config);
}

}  // namespace

TEST_CASE("hf window: Mixtral's sliding_window imports, scores and exports back", "[hf][window]") {
  test::ScratchDir dir("hf-window-mixtral");
  Tiny t = tiny_of("mixtral");
  t.window = 5;  // T 14: most queries lose keys
  json config = family_config(t);
  config["sliding_window"] = t.window;
  const io::Checkpoint c = import_and_score(dir, "w5", config, family_weights(t, 3), t);
  const ModelConfig mc = model_config_from_json(c.model_config);
  CHECK(mc.sliding_window == 5);
  CHECK(mc.window_layers.empty());
  round_trip(dir, "w5", c, {{"sliding_window", 5}});
  // A model without a window writes null, as before.
  const io::Checkpoint plain = test::import_hf_held([&] {
    write_hf_dir(dir.file("plain"), family_config(tiny_of("mixtral")), family_weights(t, 3), 1);
    return dir.file("plain");
  }());
  io::export_hf(plain, dir.file("plain-out"));
  CHECK(config_of(dir.file("plain-out")).at("sliding_window").is_null());
}

// Qwen2-MoE slides the layers layer_types marks (transformers 5 writes them), or, without
// layer_types, the even layers below max_window_layers (Qwen2MoeConfig's default list).
TEST_CASE("hf window: Qwen2-MoE's layer_types and max_window_layers", "[hf][window]") {
  test::ScratchDir dir("hf-window-qwen2");
  Tiny t = tiny_of("qwen2_moe");
  t.L = 3;
  t.window = 3;
  t.window_layers = {0, 2};
  json config = family_config(t);
  config["use_sliding_window"] = true;
  config["sliding_window"] = 3;
  config["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  const auto w = family_weights(t, 4);
  const io::Checkpoint c = import_and_score(dir, "types", config, w, t);
  const ModelConfig mc = model_config_from_json(c.model_config);
  CHECK(mc.sliding_window == 3);
  CHECK(mc.window_layers == std::vector<int64_t>{0, 2});
  round_trip(dir, "types", c,
             {{"use_sliding_window", true},
              {"sliding_window", 3},
              {"layer_types", {"sliding_attention", "full_attention", "sliding_attention"}}});
  // The same model described by max_window_layers 3 (4.x configs): layers 0 and 2 slide.
  json old = config;
  old.erase("layer_types");
  old["max_window_layers"] = 3;
  write_hf_dir(dir.file("old"), old, w, 1);
  CHECK(test::import_hf_held(dir.file("old")).model_config == c.model_config);
  // max_window_layers 1: only layer 0.
  old["max_window_layers"] = 1;
  write_hf_dir(dir.file("one"), old, w, 1);
  CHECK(model_config_from_json(test::import_hf_held(dir.file("one")).model_config).window_layers ==
        std::vector<int64_t>{0});
  // use_sliding_window false: no window whatever sliding_window says (transformers sets it 0).
  old["use_sliding_window"] = false;
  write_hf_dir(dir.file("off"), old, w, 1);
  CHECK(model_config_from_json(test::import_hf_held(dir.file("off")).model_config).sliding_window ==
        0);
}

TEST_CASE("hf window: Qwen3-MoE's use_sliding_window slides every layer", "[hf][window]") {
  test::ScratchDir dir("hf-window-qwen3");
  Tiny t = tiny_of("qwen3_moe");
  t.window = 4;
  json config = family_config(t);
  config["use_sliding_window"] = true;
  config["sliding_window"] = 4;
  const io::Checkpoint c = import_and_score(dir, "w4", config, family_weights(t, 5), t);
  CHECK(model_config_from_json(c.model_config).sliding_window == 4);
  round_trip(dir, "w4", c, {{"use_sliding_window", true}, {"sliding_window", 4}});
}

TEST_CASE("hf tied: tie_word_embeddings imports as one tensor and exports without lm_head",
          "[hf][tied]") {
  test::ScratchDir dir("hf-tied");
  Tiny t = tiny_of("mixtral");
  t.tied = true;
  json config = family_config(t);
  config["tie_word_embeddings"] = true;
  auto w = family_weights(t, 6);
  w.erase("lm_head.weight");  // transformers' save_pretrained leaves the tied copy out
  const io::Checkpoint c = import_and_score(dir, "tied", config, w, t);
  CHECK_FALSE(has_param(c, "lm_head.weight"));
  CHECK(model_config_from_json(c.model_config).tie_embeddings);
  round_trip(dir, "tied", c, {{"tie_word_embeddings", true}});
  const io::SafetensorsReader out(dir.file("tied-out/model.safetensors"));
  CHECK(out.find("lm_head.weight") == nullptr);
  CHECK(out.find("model.embed_tokens.weight") != nullptr);
  // A stored lm_head.weight beside tie_word_embeddings is left out (transformers ties it to the
  // embedding on load, whose values win), and the report says so.
  write_hf_dir(dir.file("stale"), config, family_weights(t, 6), 1);
  io::HfImportReport report;
  const io::Checkpoint stale = test::import_hf_held(dir.file("stale"), {}, &report);
  CHECK_FALSE(has_param(stale, "lm_head.weight"));
  bool noted = false;
  for (const std::string& note : report.notes)
    noted = noted || note.find("lm_head.weight not imported") != std::string::npos;
  CHECK(noted);

  // GGUF: no output.weight (llama.cpp's head is then token_embd), and it imports back tied with
  // the same tensors.
  io::export_gguf(c, dir.file("tied.gguf"), io::GgufExportOptions{});
  const io::GgufFile g = io::read_gguf(dir.file("tied.gguf"));
  bool output = false;
  for (const auto& info : g.tensors) output = output || info.name == "output.weight";
  CHECK_FALSE(output);
  const io::GgufImportPlan plan = io::plan_gguf_import(dir.file("tied.gguf"));
  CHECK(plan.config.tie_embeddings);
  for (const auto& tensor : plan.tensors) CHECK(tensor.ours != "lm_head.weight");
}

TEST_CASE("hf window: what a format cannot say is refused by name", "[hf][window]") {
  test::ScratchDir dir("hf-window-refused");
  Tiny t = tiny_of("mixtral");
  json config = family_config(t);
  config["sliding_window"] = 5;
  write_hf_dir(dir.file("w5"), config, family_weights(t, 3), 1);
  io::Checkpoint c = test::import_hf_held(dir.file("w5"));
  // llama.cpp's llama architecture has no window: a window shorter than the context is refused.
  REQUIRE_THAT(test::error_of([&] { io::export_gguf(c, dir.file("w5.gguf"), {}); }),
               Catch::Contains("llama.cpp's llama has no sliding-window attention") &&
                   Catch::Contains("last 5 of its 64 positions"));
  // HF Mixtral slides every layer or none.
  ModelConfig mc = model_config_from_json(c.model_config);
  mc.window_layers = {1};
  c.model_config = to_json(mc);
  REQUIRE_THAT(test::error_of([&] { io::export_hf(c, dir.file("partial")); }),
               Catch::Contains("slides its window on every layer or on none") &&
                   Catch::Contains("on 1 of its 2 layers"));
  // A window of 0 or less is no window transformers can run.
  config["sliding_window"] = 0;
  write_hf_dir(dir.file("zero"), config, family_weights(t, 3), 1);
  REQUIRE_THAT(test::error_of([&] { test::import_hf_held(dir.file("zero")); }),
               Catch::Contains("\"sliding_window\" is 0: it must be >= 1"));
}
