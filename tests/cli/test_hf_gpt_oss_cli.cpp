// gpt-oss through the tools, as a user meets it: a tiny transformers-format GptOssForCausalLM
// directory in the released form (support/hf_gpt_oss.h: bf16 with F32 norms, experts as MXFP4
// _blocks/_scales, quantization_config) with a real tokenizer.json beside it is imported by
// moe-convert import-hf (the experts dequantised exactly); moe-infer generate continues a text
// prompt with the greedy continuation of the independent double-precision reference, which sees
// the sinks, the sliding layers (window 4, shorter than prompt + continuation), every bias, the
// clamped SwiGLU and YaRN with truncate false.
// Shape letters: V vocabulary, T tokens.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/io/tokenizer.h"
#include "support/greedy.h"
#include "support/hf_gpt_oss.h"
#include "support/run.h"

using namespace moe;
using namespace moe::test::hf;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

// The reference's greedy continuation of `ids` by `n` tokens, each choice winning by a margin
// (relative to the logits' scale) that float rounding (our error: ~1e-6, test_hf_gpt_oss.cpp)
// cannot overturn.
std::vector<int32_t> gpt_oss_greedy(const TinyGptOss& t, const std::map<std::string, Tensor>& w,
                                    std::vector<int32_t> ids, int n) {
  return test::clear_greedy(std::move(ids), n, t.V, [&](const std::vector<int32_t>& x) {
    return gpt_oss_reference_logits(t, w, x, 1, static_cast<int64_t>(x.size()));
  });
}

}  // namespace

TEST_CASE("cli: an imported MXFP4 gpt-oss generates as the reference does", "[cli][hf][gpt_oss]") {
  test::ScratchDir dir("cli-hf-gpt-oss");
  const std::string tokenizer =
      std::string(MOE_TEST_SOURCE_DIR) + "/tests/data/tokenizers/bpe-qwen";
  const auto tok = io::load_tokenizer(tokenizer);
  const std::string prompt = "The quick brown fox";
  const std::string prompts = dir / "prompts.txt";
  test::write_file(prompts, prompt + "\n");
  TinyGptOss t;
  t.V = 704;  // room for the tokenizer's 700 ids
  const auto packed = gpt_oss_mxfp4(t, 51);
  const std::string hf = dir / "gpt-oss", ckpt = dir / "gpt-oss.h5";
  write_hf_dir(hf, gpt_oss_mxfp4_config(t), packed, 2);
  fs::copy_file(tokenizer + "/tokenizer.json", fs::path(hf) / "tokenizer.json");
  auto i = run_command(tool("moe-convert", "import-hf " + hf + " -o " + ckpt));
  INFO(i.err);
  REQUIRE(i.exit_code == 0);
  REQUIRE(i.err.find("imported a gpt_oss checkpoint") != std::string::npos);

  auto g = run_command(
      tool("moe-infer", "generate -q --model " + ckpt + " --prompts " + prompts + " --max-new 6"));
  INFO(g.err);
  REQUIRE(g.exit_code == 0);
  const auto out = test::lines_of(g.out);
  REQUIRE(out.size() == 1);
  const nlohmann::json j = nlohmann::json::parse(out[0]);
  const std::vector<int32_t> ids = tok->encode(prompt, true);
  REQUIRE(int64_t(ids.size()) + 6 > t.window);  // the window cuts in
  REQUIRE(j.at("completion_ids").get<std::vector<int32_t>>() ==
          gpt_oss_greedy(t, gpt_oss_dequantized(packed), ids, 6));
}

TEST_CASE("cli: import-hf --keep-mxfp4 keeps gpt-oss's experts in blocks", "[cli][hf][gpt_oss]") {
  test::ScratchDir dir("cli-hf-gpt-oss-keep");
  const std::string prompts = dir / "prompts.txt";
  test::write_file(prompts, "1 2 3\n4 5 6 7\n");
  const TinyGptOss t;
  const std::string hf = dir / "gpt-oss", ckpt = dir / "kept.h5", plain = dir / "plain.h5";
  write_hf_dir(hf, gpt_oss_mxfp4_config(t), gpt_oss_mxfp4(t, 52), 1);
  auto i = run_command(tool("moe-convert", "import-hf " + hf + " --keep-mxfp4 -o " + ckpt));
  INFO(i.err);
  REQUIRE(i.exit_code == 0);
  auto p = run_command(tool("moe-convert", "import-hf " + hf + " -o " + plain));
  REQUIRE(p.exit_code == 0);
  // 4-bit experts: the file is smaller than the dequantised (bf16) one.
  REQUIRE(fs::file_size(ckpt) < fs::file_size(plain));
  auto d = run_command(tool("moe-convert", "inspect --json " + ckpt));
  INFO(d.err);
  REQUIRE(d.exit_code == 0);
  REQUIRE(d.out.find("mxfp4") != std::string::npos);
  // Token-id prompts (no tokenizer in the directory): both prompts continue, 4 tokens each.
  auto g = run_command(
      tool("moe-infer", "generate -q --model " + ckpt + " --prompts " + prompts + " --max-new 4"));
  INFO(g.err);
  REQUIRE(g.exit_code == 0);
  const auto out = test::lines_of(g.out);
  REQUIRE(out.size() == 2);
  for (const std::string& line : out)
    REQUIRE(nlohmann::json::parse(line).at("completion_ids").size() == 4);
}
