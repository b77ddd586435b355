// Weights that exploded while staying finite (issue 45, item 6): `moe-train --lr 1e30` for one
// step wrote parameters of 3e28, which every check of finite values passed, and `moe-infer score`
// then printed `nll_mean -nan, ppl -nan` with exit 0. Now the step that explodes them stops the
// run as a diverging step does, and no tool prints a NaN as a result: score, loglikelihood and
// generate each say which window, request or prompt, and why.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "moe/io/checkpoint.h"
#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

void expect_error(const test::RunResult& r, const std::string& tool_name,
                  const std::vector<std::string>& needles) {
  INFO(r.err);
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find(tool_name + ": error: ") == 0);
  for (const std::string& n : needles) REQUIRE_THAT(r.err, Catch::Contains(n));
}

}  // namespace

TEST_CASE("cli: an update that explodes the weights while finite stops the run",
          "[cli][validation]") {
  test::ScratchDir dir("cli-exploded-train");
  const std::string data = " --data " + test::fortunes_path("linux");
  // Resident parameters (gpt), then experts updated inside the host store (mixtral, --offload).
  for (const std::string& extra : {std::string(), std::string(" --arch mixtral --offload host")}) {
    const std::string out = dir / (extra.empty() ? "resident" : "offloaded");
    auto r = run_command(tool(
        "moe-train", data + " --out " + out + test::kTinyModel + extra + " --steps 1 --lr 1e30"));
    expect_error(
        r, "moe-train",
        {"step 1, after the update (the run diverged; nothing saved", "tensor '", "has exploded"});
    if (!extra.empty()) REQUIRE_THAT(r.err, Catch::Contains("(expert "));
    REQUIRE_FALSE(fs::exists(fs::path(out) / "step-00000001.h5"));
    REQUIRE_FALSE(fs::exists(fs::path(out) / "last.h5"));
  }
}

TEST_CASE("cli: weights that make the model compute NaN give no score, only an error",
          "[cli][validation]") {
  test::ScratchDir dir("cli-exploded-infer");
  const std::string ckpt = test::train_on_fortunes(dir / "run", test::kTinyMixtral + " --steps 2");
  // What one step at --lr 1e12 wrote before the training check: Adam moved every weight by about
  // the rate (times the warmup's share), up or down, to +-3e10 or so; all finite, and the model
  // computes NaN from them (as from --lr 1e30's 3e28: the case).
  io::Checkpoint c = io::load_checkpoint(ckpt);
  for (io::NamedTensor& nt : c.params) {
    REQUIRE(nt.tensor.dtype() == DType::f32);
    float* w = nt.tensor.data<float>();
    for (int64_t i = 0; i < nt.tensor.numel(); ++i)
      w[i] += (uint32_t(i) * 2654435761u >> 9) % 2 ? 3e10f : -3e10f;
  }
  const std::string bad = dir / "exploded.h5";
  io::save_checkpoint(bad, c);
  // The loaders take it (every value is finite): the model's output is what is wrong.
  REQUIRE(run_command(tool("moe-convert", "inspect --verify " + bad)).exit_code == 0);

  const std::string data = test::fortunes_path("computers");
  auto score =
      run_command(tool("moe-infer", "score --model " + bad + " --data " + data +
                                        " --max-sequences 3 -o " + (dir / "scores.jsonl")));
  expect_error(score, "moe-infer",
               {"window 0 of '" + data + "' (tokens 0..16): its log-likelihood is NaN",
                "non-finite logits from its weights", "no score is given"});
  REQUIRE_THAT(score.out + score.err, !Catch::Contains("nan") && !Catch::Contains("null"));
  REQUIRE_FALSE(fs::exists(dir / "scores.jsonl"));

  std::ofstream(dir / "requests.jsonl") << "{\"context\": \"The kernel\", \"continuation\": "
                                           "\" panics\"}\n";
  auto ll = run_command(tool(
      "moe-infer", "loglikelihood --model " + bad + " --requests " + (dir / "requests.jsonl")));
  expect_error(ll, "moe-infer",
               {"the request on line 1: a log-probability of its continuation is not finite",
                "non-finite logits from its weights"});
  REQUIRE(ll.out.empty());

  std::ofstream(dir / "prompts.txt") << "Unix is\n";
  auto gen = run_command(tool("moe-infer", "generate --model " + bad + " --prompts " +
                                               (dir / "prompts.txt") + " --max-new 4"));
  expect_error(gen, "moe-infer", {"generation: prompt 0", "non-finite logits from its weights"});
  REQUIRE(gen.out.empty());

  // The same model before the damage scores: the refusals above are the weights', not the files'.
  auto good = run_command(
      tool("moe-infer", "score --model " + ckpt + " --data " + data + " --max-sequences 3 -q"));
  INFO(good.err);
  REQUIRE(good.exit_code == 0);
  REQUIRE(test::lines_of(good.out).size() == 3);
}
