// moe-convert quantize as a user runs it, on a model moe-train just trained: the Q8_0 file's
// layout (u8 rows, the config's "quantization"), moe-infer score within a Q8_0 tolerance of the
// f32 scores (also through the decode path, score --incremental) and generate running on it, and
// the refusals: quantising twice, an existing output without --force, moe-train --resume,
// moe-distill --teacher and the other conversions.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "moe/io/checkpoint.h"
#include "support/run.h"

using namespace moe;
using test::lines_of;
using test::run_command;
using test::tool;

TEST_CASE("cli: moe-convert quantize q8_0 is served by moe-infer and refused elsewhere",
          "[cli][convert][quantize]") {
  test::ScratchDir dir("cli-quantize");
  const std::string ckpt = test::train_on_fortunes(dir / "run", test::kTinyMixtral + " --steps 3");
  const std::string q8 = dir / "q8.h5";
  auto r = run_command(tool("moe-convert", "quantize " + ckpt + " -o " + q8));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.err.find("quantize q8_0: ") != std::string::npos);
  const io::Checkpoint q = io::load_checkpoint(q8);
  REQUIRE(q.model_config["quantization"] == "q8_0");
  REQUIRE(q.optim.empty());
  const io::NamedTensor* w1 = nullptr;
  for (const io::NamedTensor& nt : q.params)
    if (nt.name == "blocks.0.moe.experts.w1") w1 = &nt;
  REQUIRE(w1);
  // [E, F, D] with D = 16: rows of 16 int8 values and one f16 scale (18 bytes).
  REQUIRE(w1->tensor.dtype() == DType::u8);
  REQUIRE(w1->tensor.shape() == Shape{4, 32, 18});

  const std::string data = " --data " + test::fortunes_path("computers") + " --max-sequences 16";
  auto a = run_command(tool("moe-infer", "score -q --model " + ckpt + data));
  auto b = run_command(tool("moe-infer", "score -q --model " + q8 + data));
  INFO(a.err << b.err);
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  const std::vector<std::string> la = lines_of(a.out), lb = lines_of(b.out);
  REQUIRE(la.size() == 16);
  REQUIRE(lb.size() == la.size());
  double worst = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    const double x = nlohmann::json::parse(la[i])["nll_mean"],
                 y = nlohmann::json::parse(lb[i])["nll_mean"];
    worst = std::max(worst, std::fabs(x - y));
  }
  // Each weight moves by at most half a step of its block (max|w| / 254): the mean NLL moves by
  // well under 1% of its value at this size; it does move (the weights did change).
  CHECK(worst > 0);
  CHECK(worst < 0.02);
  // --incremental scores through the decode path (a token at a time, 8 windows as 8 cache
  // slots): the f32 model's scores are the full pass's up to summation order (the GEMV's fixed
  // lanes against a BLAS tile: 1e-4, as test_decode bounds the logits); the Q8_0 model's move
  // further, as its decode GEMV multiplies 8-bit inputs, but stay within the same 0.02.
  auto ai = run_command(tool("moe-infer", "score -q --incremental --model " + ckpt + data));
  auto bi = run_command(tool("moe-infer", "score -q --incremental --model " + q8 + data));
  INFO(ai.err << bi.err);
  REQUIRE(ai.exit_code == 0);
  REQUIRE(bi.exit_code == 0);
  const std::vector<std::string> lai = lines_of(ai.out), lbi = lines_of(bi.out);
  REQUIRE(lai.size() == la.size());
  REQUIRE(lbi.size() == la.size());
  double f32_moved = 0, q8_moved = 0, q8_worst = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    auto nll = [&](const std::vector<std::string>& lines) -> double {
      return nlohmann::json::parse(lines[i])["nll_mean"];
    };
    f32_moved = std::max(f32_moved, std::fabs(nll(lai) - nll(la)));
    q8_moved = std::max(q8_moved, std::fabs(nll(lbi) - nll(lb)));
    q8_worst = std::max(q8_worst, std::fabs(nll(lbi) - nll(la)));
  }
  CHECK(f32_moved < 1e-4);
  CHECK(q8_moved > 0);
  CHECK(q8_worst < 0.02);
  auto g = run_command("printf 'hello\\n' | " +
                       tool("moe-infer", "generate -q --model " + q8 + " --prompts - --max-new 5"));
  INFO(g.err);
  REQUIRE(g.exit_code == 0);
  REQUIRE(nlohmann::json::parse(lines_of(g.out).at(0))["tokens"] == 5);

  // Quantising twice: a usage error saying so.
  auto twice = run_command(tool("moe-convert", "quantize " + q8 + " -o " + (dir / "qq.h5")));
  CHECK(twice.exit_code == 2);
  CHECK(twice.err.find("already quantised") != std::string::npos);
  // An existing output is kept without --force.
  auto exists = run_command(tool("moe-convert", "quantize " + ckpt + " -o " + q8));
  CHECK(exists.exit_code == 1);
  CHECK(exists.err.find("already exists; remove it or pass --force") != std::string::npos);
  auto unknown = run_command(tool("moe-convert", "quantize " + ckpt + " --type q4_0 -o x.h5"));
  CHECK(unknown.exit_code == 2);
  // The tools that cannot use it name the quantisation.
  for (const std::string& command :
       {tool("moe-convert", "dtype " + q8 + " --to bf16 -o " + (dir / "d.h5")),
        tool("moe-convert", "freeze " + q8 + " -o " + (dir / "f.h5")),
        tool("moe-convert", "export-gguf " + q8 + " -o " + (dir / "q8.gguf")),
        tool("moe-convert", "export-hf " + q8 + " -o " + (dir / "hf")),
        tool("moe-train", "--data " + test::fortunes_path("linux") + " --out " + (dir / "r2") +
                              " --resume " + q8 + test::kTinyMixtral + " --steps 4"),
        tool("moe-distill", "--teacher " + q8 + " --data " + test::fortunes_path("linux") + " -o " +
                                (dir / "s.h5") + " --steps 1 --threads 1 -q")}) {
    INFO(command);
    auto refused = run_command(command);
    INFO(refused.err);
    CHECK(refused.exit_code == 1);
    CHECK(refused.err.find("quantised") != std::string::npos);
  }
}

// The block recipes (llama.cpp's q4_k / q6_k / mxfp4 and the Q4_K_M mix) as a user runs them, on a
// model 256 wide (whole 256-value blocks): moe-infer scores (full pass and through the decode
// GEMV) and generates from the file, and the tools that cannot use it refuse it by the recipe.
TEST_CASE("cli: moe-convert quantize q4_k_m is served by moe-infer and refused elsewhere",
          "[cli][convert][quantize]") {
  test::ScratchDir dir("cli-quantize-blocks");
  const std::string ckpt = test::train_on_fortunes(
      dir / "run", " --arch mixtral --layers 2 --d-model 256 --heads 4 --kv-heads 2 --d-ff 256"
                   " --seq 16 --experts 4 --moe-every 1 --batch 2 --eval-batches 1 --threads 1 -q"
                   " --steps 3");
  const std::string q4 = dir / "q4.h5";
  auto r = run_command(tool("moe-convert", "quantize " + ckpt + " --type q4_k_m -o " + q4));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  // 2 layers: use_more_bits picks layer 1 only (i >= 7 * 2 / 8 = 1; the first eighth, 2 / 8 = 0
  // layers, is empty), so its attention v and experts' w2 are q6_k, with the LM head: 3 of 15.
  REQUIRE(r.err.find("15 weight tensors (12 q4_k, 3 q6_k)") != std::string::npos);
  const nlohmann::json config = io::read_model_config(q4);
  REQUIRE(config["quantization"] == "q4_k_m");
  REQUIRE(config["tensor_formats"]["blocks.1.moe.experts.w2"] == "q6_k");
  REQUIRE(config["tensor_formats"]["blocks.0.moe.experts.w2"] == "q4_k");
  REQUIRE(config["tensor_formats"]["blocks.1.moe.experts.w1"] == "q4_k");
  // [E, F, D] = [4, 256, 256]: a row of 256 values is one q4_k block of 144 bytes.
  REQUIRE(io::read_expert(q4, "blocks.0.moe.experts.w1", 0).shape() == Shape{256, 144});

  const std::string data = " --data " + test::fortunes_path("computers") + " --max-sequences 8";
  for (const char* mode : {"", "--incremental "}) {
    INFO("score " << mode);
    auto a = run_command(tool("moe-infer", std::string("score -q ") + mode + "--model " + ckpt + data));
    auto b = run_command(tool("moe-infer", std::string("score -q ") + mode + "--model " + q4 + data));
    INFO(a.err << b.err);
    REQUIRE(a.exit_code == 0);
    REQUIRE(b.exit_code == 0);
    const std::vector<std::string> la = lines_of(a.out), lb = lines_of(b.out);
    REQUIRE(la.size() == 8);
    REQUIRE(lb.size() == la.size());
    double worst = 0;
    for (size_t i = 0; i < la.size(); ++i)
      worst = std::max(worst, std::fabs(double(nlohmann::json::parse(la[i])["nll_mean"]) -
                                        double(nlohmann::json::parse(lb[i])["nll_mean"])));
    // 4-bit weights (RMS error about 7% of a weight) move this barely trained model's mean NLL
    // (about ln 256 = 5.5) by a few hundredths at most; they do move it.
    CHECK(worst > 0);
    CHECK(worst < 0.1);
  }
  test::write_file(dir / "prompts.txt", "The quick brown\nUnix is\n");
  auto g = run_command(tool("moe-infer", "generate -q --model " + q4 + " --prompts " +
                                             (dir / "prompts.txt") + " --max-new 6"));
  INFO(g.err);
  REQUIRE(g.exit_code == 0);
  REQUIRE(lines_of(g.out).size() == 2);

  // export-gguf writes the blocks as they are (GGUF's own bytes): imported back, the model
  // holds the same bytes, so it scores bit for bit as the quantised checkpoint.
  const std::string gguf = dir / "q4.gguf", back = dir / "back.h5";
  auto e = run_command(tool("moe-convert", "export-gguf " + q4 + " -o " + gguf));
  INFO(e.err);
  REQUIRE(e.exit_code == 0);
  auto i = run_command(tool("moe-convert", "import-gguf " + gguf + " -o " + back));
  INFO(i.err);
  REQUIRE(i.exit_code == 0);
  REQUIRE(io::read_model_config(back)["tensor_formats"] == config["tensor_formats"]);
  auto s1 = run_command(tool("moe-infer", "score -q --per-token --model " + q4 + data));
  auto s2 = run_command(tool("moe-infer", "score -q --per-token --model " + back + data));
  REQUIRE(s1.exit_code == 0);
  REQUIRE(s2.exit_code == 0);
  CHECK(s1.out == s2.out);
  auto t = run_command(tool("moe-train", "--resume " + q4 + " --out " + (dir / "again") +
                                             " --data " + test::fortunes_path("linux")));
  REQUIRE(t.exit_code != 0);
  REQUIRE(t.err.find("holds quantised rows (moe-convert quantize)") != std::string::npos);
}
