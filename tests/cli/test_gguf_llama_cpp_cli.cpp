// moe-convert import-gguf of files llama.cpp itself wrote (tests/data/gguf_llama_cpp, made once by
// its make_fixture.sh): a tiny Mixtral saved by transformers, converted by llama.cpp's
// convert_hf_to_gguf.py to f32 and to q8_0.
//   f32:  the GGUF imports as the Hugging Face directory it came from imports: every score and
//         every generated token identical (the converter's q/k row permutation undone exactly,
//         the SentencePiece tokenizer rebuilt from the GGUF's vocabulary);
//   q8_0: the imported model scores exactly as the model llama.cpp's own reader (gguf-py's
//         GGUFReader + dequantize) reads out of the file, written as f32 safetensors beside it;
//         the q8_0 blocks are kept as blocks (the import says so).
// Scoring widens q8_0 weights to f32 and runs the f32 products, so equal weights give equal bits.
#include <catch2/catch.hpp>
#include <filesystem>

#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;

namespace {

const std::string kFixture = std::string(MOE_TEST_SOURCE_DIR) + "/tests/data/gguf_llama_cpp";

std::string convert(const std::string& args) {
  const auto r = run_command(tool("moe-convert", args));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return r.err;
}

// moe-infer's output for the model on a real text, without the timing fields.
std::string infer(const std::string& args) {
  const auto r = run_command(tool("moe-infer", args + " --threads 1 -q"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  std::string out;
  for (const std::string& line : test::lines_of(r.out))
    if (line.find("_per_s") == std::string::npos) out += line + "\n";
  REQUIRE(!out.empty());
  return out;
}

std::string scores(const std::string& model) {
  return infer("score --model " + model + " --data " + test::fortunes_path("linux") +
               " --max-sequences 6");
}

}  // namespace

TEST_CASE("cli: an f32 GGUF written by llama.cpp's converter imports as its source",
          "[cli][gguf]") {
  test::ScratchDir dir("cli-gguf-llama-cpp-f32");
  const std::string from_hf = dir / "hf.h5", from_gguf = dir / "gguf.h5";
  convert("import-hf " + kFixture + "/hf -o " + from_hf + " -q");
  const std::string said =
      convert("import-gguf " + kFixture + "/mixtral-f32.gguf -o " + from_gguf);
  REQUIRE_THAT(said, Catch::Contains("imported a GGUF llama model as mixtral"));
  REQUIRE_THAT(said, Catch::Contains("SentencePiece, 600 tokens"));
  REQUIRE(scores(from_gguf) == scores(from_hf));
  test::write_file(dir / "prompts.txt", "The kernel\nUnix is\n");
  const std::string prompts = " --prompts " + (dir / "prompts.txt") + " --max-new 12";
  REQUIRE(infer("generate --model " + from_gguf + prompts) ==
          infer("generate --model " + from_hf + prompts));
}

TEST_CASE("cli: a q8_0 GGUF written by llama.cpp's converter scores as llama.cpp reads it",
          "[cli][gguf]") {
  test::ScratchDir dir("cli-gguf-llama-cpp-q8");
  // What gguf-py reads out of the file, under the source's config and tokenizer.
  const std::string read_back = dir / "read-back";
  std::filesystem::create_directory(read_back);
  for (const char* f : {"config.json", "tokenizer.model", "tokenizer_config.json"})
    std::filesystem::copy_file(kFixture + "/hf/" + f, read_back + "/" + f);
  std::filesystem::copy_file(kFixture + "/q8_0-dequantized.safetensors",
                             read_back + "/model.safetensors");
  const std::string expected = dir / "expected.h5", q8 = dir / "q8.h5", f32 = dir / "f32.h5";
  convert("import-hf " + read_back + " -o " + expected + " -q");
  REQUIRE_THAT(convert("import-gguf " + kFixture + "/mixtral-q8_0.gguf -o " + q8),
               Catch::Contains("(q8_0 weights)"));
  REQUIRE(scores(q8) == scores(expected));
  // And the f32 source scores differently: the comparison above can tell weights apart.
  convert("import-hf " + kFixture + "/hf -o " + f32 + " -q");
  REQUIRE(scores(f32) != scores(expected));
}
