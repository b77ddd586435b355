// DeepSeek-V3 through the tools, as a user meets it: a tiny transformers-format
// DeepseekV3ForCausalLM directory (support/hf_deepseek_v3_model.h: every tensor the class creates,
// a multi-token-prediction layer, n_group > 1) with a real tokenizer.json beside it is imported by
// moe-convert import-hf (which says it skipped the prediction layer); moe-infer generate (the KV
// cache decode path) continues a text prompt with the greedy continuation of the independent
// double-precision reference; export-hf writes the family back; export-gguf writes llama.cpp's
// deepseek2.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/io/gguf.h"
#include "moe/io/tokenizer.h"
#include "support/greedy.h"
#include "support/hf_deepseek_v3_model.h"
#include "support/run.h"

using namespace moe;
using namespace moe::test::hf;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

// The reference's greedy continuation of `ids` by `n` tokens, each choice winning by a margin
// (relative to the logits' scale) that float rounding cannot overturn.
std::vector<int32_t> reference_greedy(const TinyDeepseek& t, const std::map<std::string, Tensor>& w,
                                      std::vector<int32_t> ids, int n) {
  return test::clear_greedy(std::move(ids), n, t.moe.V, [&](const std::vector<int32_t>& x) {
    return deepseek_reference_logits(t, w, x, 1, static_cast<int64_t>(x.size()));
  });
}

}  // namespace

TEST_CASE("cli: an imported DeepSeek-V3 generates and exports back", "[cli][hf][deepseek_v3]") {
  test::ScratchDir dir("cli-hf-deepseek-v3");
  const std::string tokenizer =
      std::string(MOE_TEST_SOURCE_DIR) + "/tests/data/tokenizers/bpe-qwen";
  const auto tok = io::load_tokenizer(tokenizer);
  const std::string prompt = "The quick brown fox";
  const std::string prompts = dir / "prompts.txt";
  test::write_file(prompts, prompt + "\n");
  TinyDeepseek t;
  t.moe.V = 704;  // room for the tokenizer's 700 ids
  const auto w = deepseek_weights(t, 41);
  const std::string hf = dir / "ds", ckpt = dir / "ds.h5";
  write_hf_dir(hf, deepseek_config(t), w, 2);
  fs::copy_file(tokenizer + "/tokenizer.json", fs::path(hf) / "tokenizer.json");
  auto i = run_command(tool("moe-convert", "import-hf " + hf + " -o " + ckpt));
  INFO(i.err);
  REQUIRE(i.exit_code == 0);
  REQUIRE(i.err.find("imported a deepseek_v3 checkpoint") != std::string::npos);
  REQUIRE(i.err.find("multi-token-prediction layers (3..3") != std::string::npos);

  auto g = run_command(
      tool("moe-infer", "generate -q --model " + ckpt + " --prompts " + prompts + " --max-new 5"));
  INFO(g.err);
  REQUIRE(g.exit_code == 0);
  const auto out = test::lines_of(g.out);
  REQUIRE(out.size() == 1);
  const nlohmann::json j = nlohmann::json::parse(out[0]);
  REQUIRE(j.at("completion_ids").get<std::vector<int32_t>>() ==
          reference_greedy(t, w, tok->encode(prompt, true), 5));

  const std::string back = dir / "ds-back";
  auto e = run_command(tool("moe-convert", "export-hf " + ckpt + " -o " + back));
  INFO(e.err);
  REQUIRE(e.exit_code == 0);
  const nlohmann::json c = nlohmann::json::parse(test::read_file(back + "/config.json"));
  REQUIRE(c["model_type"] == "deepseek_v3");
  REQUIRE(c["kv_lora_rank"] == t.attn.c);
  REQUIRE(c["q_lora_rank"] == t.attn.r);
  REQUIRE(c["first_k_dense_replace"] == t.moe.dense);

  const std::string gguf = dir / "ds.gguf";
  auto r = run_command(tool("moe-convert", "export-gguf " + ckpt + " -o " + gguf));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);  // llama.cpp's deepseek2 (keys and tensors: test_gguf_deepseek2.cpp)
  REQUIRE(io::read_gguf(gguf).metadata["general.architecture"]["value"] == "deepseek2");
}
