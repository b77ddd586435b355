// moe-train --init: a fresh run that starts from a checkpoint's weights (fine-tuning a trained or
// imported model). The step-0 checkpoint holds the source's parameters bitwise, zero moments and
// step 0; the model is the source's (a contradicting model flag is refused, a training-time one
// such as --aux-loss-coef is taken); --resume and --init exclude each other; a model imported
// with a tokenizer trains on text read through it, and carries it on.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "moe/io/checkpoint.h"
#include "moe/io/dataset.h"
#include "moe/io/tokenizer.h"
#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

std::map<std::string, Tensor> by_name(const std::vector<io::NamedTensor>& tensors) {
  std::map<std::string, Tensor> out;
  for (const io::NamedTensor& nt : tensors) out[nt.name] = nt.whole();
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("cli: moe-train --init starts a fresh run from a checkpoint's weights", "[cli][init]") {
  test::ScratchDir dir("cli-init");
  const std::string source =
      test::train_on_fortunes(dir / "source", test::kTinyMixtral + " --steps 3 --dtype bf16");
  const std::string data = test::fortunes_path("computers");
  const std::string common = " --data " + data + " --steps 2 --batch 4 --threads 1 -q";

  auto r = run_command(tool("moe-train", "--init " + source + " --out " + dir / "tuned" + common +
                                             " --checkpoint-at-start --aux-loss-coef 0.2"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const io::Checkpoint src = io::load_checkpoint(source);
  const io::Checkpoint start = io::load_checkpoint(dir / "tuned/step-00000000.h5");
  REQUIRE(start.state.step == 0);
  REQUIRE(start.state.tokens_seen == 0);
  REQUIRE(start.state.data_cursor == 0);
  // The model is the source's, with the training-time setting given now.
  nlohmann::json want = src.model_config;
  want["aux_loss_coef"] = 0.2;
  REQUIRE(start.model_config == want);
  const auto params = by_name(start.params), source_params = by_name(src.params);
  REQUIRE(params.size() == source_params.size());
  for (const auto& [name, t] : source_params) {
    INFO(name);
    REQUIRE(params.count(name));
    REQUIRE(same_bytes(params.at(name), t));
  }
  // Fresh optimizer: zero moments; the fp32 masters are the bf16 values widened.
  int masters = 0;
  for (const auto& [name, t] : by_name(start.optim)) {
    INFO(name);
    if (name.rfind("master.", 0) == 0) {
      REQUIRE(same_bytes(t, source_params.at(name.substr(7)).to(DType::f32)));
      ++masters;
    } else {
      const Tensor f = t.to(DType::f32);
      const float* v = f.data<float>();
      for (int64_t i = 0; i < f.numel(); ++i) REQUIRE(v[i] == 0.0f);
    }
  }
  // Every parameter has a master but the routers' centers (frozen: no optimizer state).
  int centers = 0;
  for (const auto& [name, t] : source_params)
    if (name.ends_with(".moe.router.center")) ++centers;
  REQUIRE(centers == 2);  // moe-train centres its routers by default
  REQUIRE(masters == static_cast<int>(source_params.size()) - centers);
  REQUIRE(io::load_checkpoint(dir / "tuned/last.h5").state.step == 2);

  SECTION("the model is the checkpoint's: a contradicting model flag is refused") {
    auto bad = run_command(
        tool("moe-train", "--init " + source + " --out " + dir / "bad" + common + " --d-model 32"));
    REQUIRE(bad.exit_code == 2);
    REQUIRE(bad.err.find("--init keeps the model") != std::string::npos);
  }
  SECTION("turning the selection-bias update on would add a parameter: refused") {
    auto bias = run_command(tool("moe-train", "--init " + source + " --out " + dir / "bias" +
                                                  common + " --balance-bias-rate 0.01"));
    REQUIRE(bias.exit_code == 2);
    REQUIRE(bias.err.find("selection bias") != std::string::npos);
  }
  SECTION("turning router centring off would drop a parameter: refused") {
    auto off = run_command(tool("moe-train", "--init " + source + " --out " + dir / "center" +
                                                 common + " --router-center-rate 0"));
    REQUIRE(off.exit_code == 2);
    REQUIRE(off.err.find("running mean") != std::string::npos);
  }
  SECTION("--init and --resume exclude each other") {
    auto both = run_command(tool("moe-train", "--init " + source + " --resume " + source +
                                                  " --out " + dir / "both" + common));
    REQUIRE(both.exit_code == 2);
    REQUIRE(both.err.find("--resume") != std::string::npos);
  }
  SECTION("a missing checkpoint is a clear error") {
    auto missing = run_command(
        tool("moe-train", "--init " + dir / "nope.h5" + " --out " + dir / "missing" + common));
    REQUIRE(missing.exit_code != 0);
    REQUIRE(missing.err.find("nope.h5") != std::string::npos);
  }
}

TEST_CASE("cli: moe-train --init on an imported model reads text through its tokenizer",
          "[cli][init][tokenizer]") {
  test::ScratchDir dir("cli-init-tokenizer");
  const std::string tokenizers = std::string(MOE_TEST_SOURCE_DIR) + "/tests/data/tokenizers";
  const std::string ckpt =
      test::train_on_fortunes(dir / "run", test::kTinyMixtral + " --steps 2 --vocab 704");
  const std::string hf = dir / "hf", imported = dir / "imported.h5";
  REQUIRE(run_command(tool("moe-convert", "export-hf " + ckpt + " -o " + hf)).exit_code == 0);
  fs::copy_file(tokenizers + "/bpe-qwen/tokenizer.json", fs::path(hf) / "tokenizer.json");
  REQUIRE(run_command(tool("moe-convert", "import-hf " + hf + " -o " + imported)).exit_code == 0);

  const std::string data = test::fortunes_path("computers");
  auto r =
      run_command(tool("moe-train", "--init " + imported + " --out " + dir / "tuned" + " --data " +
                                        data + " --steps 2 --batch 4 --threads 1"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  // Every token of the text, as the tokenizer cuts it, is training or validation data.
  const auto tok = io::load_tokenizer(tokenizers + "/bpe-qwen");
  const size_t n = tok->encode(io::read_text_file(data)).size();
  REQUIRE(n < io::read_text_file(data).size());  // not one token per byte
  const std::string line = r.err.substr(r.err.find("data: "));
  long long train = 0, val = 0;
  REQUIRE(std::sscanf(line.c_str(), "data: %lld training tokens, %lld validation", &train, &val) ==
          2);
  REQUIRE(static_cast<size_t>(train + val) == n);
  // The tokenizer travels on.
  REQUIRE(io::read_tokenizer(dir / "tuned/last.h5").bytes ==
          test::read_file(tokenizers + "/bpe-qwen/tokenizer.json"));
}
