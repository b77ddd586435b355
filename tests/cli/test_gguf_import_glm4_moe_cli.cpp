// moe-convert import-gguf of llama.cpp's glm4moe architecture as a user meets it: a tiny
// transformers-format GLM-4-MoE directory (support/hf_glm4_moe.h: a leading dense layer, partial
// RoPE, q/k/v biases, qk-norm, sigmoid routing in 2 of 4 groups with its correction bias, a shared
// expert) with a real byte-level BPE tokenizer is imported by import-hf, written by export-gguf
// (f32) and read back by import-gguf: the checkpoint scores a text with moe-infer exactly as the
// original does (its tokenizer back from the GGUF vocabulary), the keys agreeing with the
// exporter's record of the model config. The keys alone and the refusals of files ours cannot run
// are in tests/unit/test_gguf_import.cpp.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "support/hf_glm4_moe.h"
#include "support/run.h"
#include "support/scores.h"

using namespace moe;
using namespace moe::test::hf;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

TEST_CASE("cli: import-gguf of a GLM-4-MoE export-gguf wrote scores as the original",
          "[cli][gguf][glm4_moe]") {
  test::ScratchDir dir("cli-gguf-import-glm4-moe");
  const std::string tokenizer =
      std::string(MOE_TEST_SOURCE_DIR) + "/tests/data/tokenizers/bpe-qwen";
  TinyGlm t;  // 3 layers, the first dense; 2 of 4 groups; partial RoPE; biases; qk-norm
  t.V = 704;  // room for the tokenizer's 700 ids
  const std::string hf = dir / "glm", ckpt = dir / "glm.h5", gguf = dir / "glm.gguf";
  write_hf_dir(hf, glm_config(t), glm_weights(t, 47), 1);
  fs::copy_file(tokenizer + "/tokenizer.json", fs::path(hf) / "tokenizer.json");
  auto i = run_command(tool("moe-convert", "import-hf " + hf + " -o " + ckpt + " -q"));
  INFO(i.err);
  REQUIRE(i.exit_code == 0);
  auto e = run_command(tool("moe-convert", "export-gguf " + ckpt + " -o " + gguf + " --type f32"));
  INFO(e.err);
  REQUIRE(e.exit_code == 0);
  const std::string back = dir / "back.h5";
  auto g = run_command(tool("moe-convert", "import-gguf " + gguf + " -o " + back));
  INFO(g.err);
  REQUIRE(g.exit_code == 0);
  REQUIRE_THAT(g.err, Catch::Contains("imported a GGUF glm4moe model as glm4_moe"));
  // The keys say the model the exporter recorded (else the record is ignored, with a note).
  REQUIRE_THAT(g.err, Catch::Contains("model config taken from the exporter's record"));
  const std::string data = test::fortunes_path("linux");
  const auto want = test::score_lines(ckpt, data);
  REQUIRE(test::score_lines(back, data) == want);
}
