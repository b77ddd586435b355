// Tokenizers through the tools, as a user meets them: a model exported to a Hugging Face
// directory with a tokenizer.json beside it (the tests/data Qwen-style one) imports with its
// tokenizer stored in the checkpoint; moe-infer then reads text prompts and text data through it
// (prompt ids = the tokenizer's, completion = its decoding of the ids), the tokenizer survives
// freeze, partition/merge and export-hf byte for byte, --tokenizer overrides it, and one with
// more tokens than the model is refused.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "moe/io/checkpoint.h"
#include "moe/io/tokenizer.h"
#include "moe/io/trace.h"
#include "support/run.h"

using namespace moe;
using test::lines_of;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

const std::string kTokenizers = std::string(MOE_TEST_SOURCE_DIR) + "/tests/data/tokenizers";

}  // namespace

TEST_CASE("cli: a tokenizer travels with an imported model and moe-infer reads text through it",
          "[cli][tokenizer]") {
  test::ScratchDir dir("cli-tokenizer");
  // A model with room for the tokenizer's 700 ids (trained on bytes, which it does not mind).
  const std::string ckpt =
      test::train_on_fortunes(dir / "run", test::kTinyMixtral + " --steps 2 --vocab 704");
  const std::string hf = dir / "hf", imported = dir / "imported.h5";
  auto e = run_command(tool("moe-convert", "export-hf " + ckpt + " -o " + hf));
  INFO(e.err);
  REQUIRE(e.exit_code == 0);
  REQUIRE_FALSE(fs::exists(fs::path(hf) / "tokenizer.json"));  // the trained model has none
  fs::copy_file(kTokenizers + "/bpe-qwen/tokenizer.json", fs::path(hf) / "tokenizer.json");
  auto i = run_command(tool("moe-convert", "import-hf " + hf + " -o " + imported));
  INFO(i.err);
  REQUIRE(i.exit_code == 0);
  REQUIRE(i.err.find("tokenizer kept: tokenizer.json (byte-level BPE, 700 tokens)") !=
          std::string::npos);
  const std::string bytes = test::read_file(kTokenizers + "/bpe-qwen/tokenizer.json");
  REQUIRE(io::read_tokenizer(imported).file == "tokenizer.json");
  REQUIRE(io::read_tokenizer(imported).bytes == bytes);
  const auto tok = io::load_tokenizer(kTokenizers + "/bpe-qwen");

  // generate: text prompts through the stored tokenizer.
  const std::string prompts = dir / "prompts.txt";
  test::write_file(prompts,
                   "Über den Bergen\n{\"prompt\": \"The quick brown fox\", \"max_new\": 3}\n");
  auto g = run_command(tool("moe-infer", "generate -q --model " + imported + " --prompts " +
                                             prompts + " --max-new 6 --stop zzz"));
  INFO(g.err);
  REQUIRE(g.exit_code == 0);
  const auto out = lines_of(g.out);
  REQUIRE(out.size() == 2);
  const char* texts[] = {"Über den Bergen", "The quick brown fox"};
  for (size_t k = 0; k < 2; ++k) {
    INFO(out[k]);
    const nlohmann::json j = nlohmann::json::parse(out[k]);
    REQUIRE(j.at("prompt") == texts[k]);
    const auto ids = j.at("completion_ids").get<std::vector<int32_t>>();
    REQUIRE(ids.size() == (k == 0 ? 6u : 3u));
    REQUIRE(j.at("completion") == tok->decode(ids));
  }

  // score: a text file is the tokenizer's ids, in windows of the model's context (16).
  const std::string data = dir / "data.txt";
  std::string text;
  for (int k = 0; k < 20; ++k)
    text += "Съешь ещё этих мягких булок, да выпей чаю. 今天天气很好。\n";
  test::write_file(data, text);
  const int64_t windows = (static_cast<int64_t>(tok->encode(text).size()) - 1) / 16;
  auto s = run_command(tool("moe-infer", "score -q --model " + imported + " --data " + data));
  INFO(s.err);
  REQUIRE(s.exit_code == 0);
  REQUIRE(static_cast<int64_t>(lines_of(s.out).size()) == windows);
  // --tokenizer overrides the stored one: the GPT-2-style tokenizer cuts the text otherwise.
  const auto gpt2 = io::load_tokenizer(kTokenizers + "/bpe-gpt2");
  auto s2 = run_command(tool("moe-infer", "score -q --model " + imported + " --data " + data +
                                              " --tokenizer " + kTokenizers + "/bpe-gpt2"));
  INFO(s2.err);
  REQUIRE(s2.exit_code == 0);
  REQUIRE(static_cast<int64_t>(lines_of(s2.out).size()) ==
          (static_cast<int64_t>(gpt2->encode(text).size()) - 1) / 16);

  // It survives freeze, partition + merge and export-hf byte for byte.
  const std::string frozen = dir / "frozen.h5", parts = dir / "parts", merged = dir / "merged.h5";
  REQUIRE(run_command(tool("moe-convert", "freeze " + imported + " -o " + frozen)).exit_code == 0);
  REQUIRE(io::read_tokenizer(frozen).bytes == bytes);
  REQUIRE(run_command(tool("moe-convert", "partition " + frozen + " --ranks 2 -o " + parts))
              .exit_code == 0);
  REQUIRE(run_command(tool("moe-convert", "merge " + parts + " -o " + merged)).exit_code == 0);
  REQUIRE(io::read_tokenizer(merged).bytes == bytes);
  const std::string again = dir / "hf-again";
  REQUIRE(run_command(tool("moe-convert", "export-hf " + merged + " -o " + again)).exit_code == 0);
  REQUIRE(test::read_file(again + "/tokenizer.json") == bytes);

  // A tokenizer with more tokens than the model is a usage error (exit 2) naming both.
  auto big = run_command(tool("moe-infer", "score -q --model " + ckpt + " --data " + data +
                                               " --tokenizer " + kTokenizers + "/spm"));
  REQUIRE(big.exit_code == 0);  // the SentencePiece model has 600 tokens: fits 704
  const std::string small =
      test::train_on_fortunes(dir / "small", test::kTinyMixtral + " --steps 1");
  auto refused = run_command(tool("moe-infer", "score -q --model " + small + " --data " + data +
                                                   " --tokenizer " + kTokenizers + "/spm"));
  INFO(refused.err);
  REQUIRE(refused.exit_code == 2);
  REQUIRE(refused.err.find("more tokens than the model's vocabulary (256)") != std::string::npos);
}

TEST_CASE("cli: a resumed run keeps the tokenizer of the checkpoint it resumed from",
          "[cli][tokenizer]") {
  test::ScratchDir dir("cli-tokenizer-resume");
  const std::string flags = test::kTinyMixtral + " --vocab 704";
  const std::string first = test::train_on_fortunes(dir / "run", flags + " --steps 2");
  io::Checkpoint ckpt = io::load_checkpoint(first);
  const std::string bytes = test::read_file(kTokenizers + "/bpe-qwen/tokenizer.json");
  ckpt.tokenizer = {"tokenizer.json", bytes};
  const std::string with = dir / "with-tokenizer.h5";
  io::save_checkpoint(with, ckpt);
  auto r =
      run_command(tool("moe-train", "--resume " + with + " --data " + test::fortunes_path("linux") +
                                        " --out " + (dir / "run2") + flags + " --steps 4"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const io::StoredTokenizer kept = io::read_tokenizer(dir / "run2/last.h5");
  REQUIRE(kept.file == "tokenizer.json");
  REQUIRE(kept.bytes == bytes);
}

// Issue 44, defect 0: moe-profile record read text as bytes whatever the model's tokenizer, and
// moe-distill did the same (its student then kept no tokenizer). Both now read text as moe-infer
// score does: the trace holds the windows of the tokenizer's ids, and the student keeps the
// teacher's tokenizer.
TEST_CASE("cli: moe-profile record and moe-distill read text through the model's tokenizer",
          "[cli][tokenizer]") {
  test::ScratchDir dir("cli-tokenizer-profile");
  const std::string first =
      test::train_on_fortunes(dir / "run", test::kTinyMixtral + " --vocab 704 --steps 2");
  io::Checkpoint ckpt = io::load_checkpoint(first);
  const std::string bytes = test::read_file(kTokenizers + "/bpe-qwen/tokenizer.json");
  ckpt.tokenizer = {"tokenizer.json", bytes};
  const std::string model = dir / "with-tokenizer.h5";
  io::save_checkpoint(model, ckpt);
  const auto tok = io::load_tokenizer(kTokenizers + "/bpe-qwen");

  // Words the tokenizer has whole: it cuts the text into far fewer ids than it has bytes.
  const std::string data = dir / "data.txt";
  std::string text;
  for (int k = 0; k < 40; ++k) text += "Today your friends think about money, tomorrow people.\n";
  test::write_file(data, text);
  const int64_t windows = (static_cast<int64_t>(tok->encode(text).size()) - 1) / 16;
  REQUIRE(windows < (static_cast<int64_t>(text.size()) - 1) / 16);
  const std::string trace = dir / "trace.h5";
  auto r = run_command(
      tool("moe-profile", "record -q --model " + model + " --data " + data + " -o " + trace));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(io::TraceReader(trace).tokens() == windows * 16);
  // The same windows as moe-infer score reads.
  auto s = run_command(tool("moe-infer", "score -q --model " + model + " --data " + data));
  REQUIRE(s.exit_code == 0);
  REQUIRE(static_cast<int64_t>(lines_of(s.out).size()) == windows);

  const std::string student = dir / "student";
  auto d = run_command(tool("moe-distill", "--teacher " + model + " --data " + data +
                                               " --student-layers 1 --steps 1 --batch 2"
                                               " --eval-batches 1 --threads 1 -q -o " +
                                               student));
  INFO(d.err);
  REQUIRE(d.exit_code == 0);
  const io::StoredTokenizer kept = io::read_tokenizer(student + "/last.h5");
  REQUIRE(kept.file == "tokenizer.json");
  REQUIRE(kept.bytes == bytes);
}
