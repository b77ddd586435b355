// moe-train --arch gpt_oss as a user runs it (issue 44, step 3 C2): a tiny gpt-oss (grouped-query
// heads narrower than D / H, windows of 4 on the even layers as --sliding-window gives gpt_oss by
// default, attention sinks, q/k/v/o and expert biases, the clamped SwiGLU with a limit the
// activations reach, a router logit bias, YaRN) trains the demo corpus with its loss falling,
// checkpoints its settings and parameters, resumes bit for bit, and moe-infer scores it as the
// trainer evaluated it and generates through the decode cache the tokens of the uncached forward.
// Bad gpt_oss flags are refused by name before any work, and moe-infer score --ep 2 on two ranks
// scores as one process.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "support/json_lines.h"
#include "support/run.h"
#include "support/greedy.h"

using namespace moe;
using nlohmann::json;
using test::json_lines;
using test::run_command;
using test::tool;

namespace {

// Three blocks of 4 experts (top-2), D 16, 4 heads of 6 over 2 key/value heads, F 16; no
// --moe-every (gpt_oss: every layer MoE) and no window layers (gpt_oss: the even ones).
const std::string kTiny =
    " --arch gpt_oss --layers 3 --d-model 16 --heads 4 --kv-heads 2 --head-dim 6 --d-ff 16"
    " --seq 16 --experts 4 --top-k 2 --sliding-window 4 --swiglu-alpha 1.702 --swiglu-limit 3"
    " --rope-scaling yarn --rope-factor 2 --original-max-position-embeddings 8"
    " --batch 4 --threads 1 -q";

// The uncached forward's greedy continuation of `ids` by `n` tokens (Transformer::logits over the
// whole sequence each step); each choice must win by 1e-4 of the logits' scale, more than the
// cached path's rounding (~1e-6 of it, tests/unit/test_gpt_oss_model.cpp) can overturn.
std::vector<int32_t> greedy_uncached(const Transformer& model, std::vector<int32_t> ids, int n) {
  return test::clear_greedy(std::move(ids), n, model.config().vocab_size,
                            [&](const std::vector<int32_t>& x) {
                              const int64_t T = static_cast<int64_t>(x.size());
                              return model.logits(Tensor::from_vector({1, T}, x)).to_vector();
                            });
}

}  // namespace

TEST_CASE("cli: moe-train --arch gpt_oss trains, resumes, scores and generates", "[cli][gpt_oss]") {
  test::ScratchDir dir("cli-train-gpt-oss");
  const std::string text = test::read_file(test::fortunes_path("linux"));
  const std::string val = dir / "val.txt";
  test::write_file(val, text.substr(2000, 8 * 16 + 1));  // 8 windows of 16 tokens (+1)
  const std::string run = dir / "run", resumed = dir / "resumed";
  auto r = run_command(
      tool("moe-train", "--data " + test::fortunes_path("linux") + " --val " + val + " --out " +
                            run + kTiny +
                            " --steps 150 --lr 1e-2 --warmup 1 --checkpoint-every 75 --eval-every 0"
                            " --eval-batches 2 --log-every 1 --metrics " +
                            run + "/metrics.jsonl"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);

  // The loss falls: the last two steps' mean a nat below the first two's (byte-level text from
  // ln 256 = 5.5 nats; 150 AdamW steps at 1e-2 take a model this size below 3.5).
  std::vector<double> losses;
  double val_loss = NAN;
  for (const json& j : json_lines(test::read_file(run + "/metrics.jsonl"))) {
    if (j.contains("loss") && j.contains("step")) losses.push_back(j["loss"].get<double>());
    if (j.contains("val_loss")) val_loss = j["val_loss"].get<double>();
  }
  REQUIRE(losses.size() == 150);
  for (double l : losses) REQUIRE(std::isfinite(l));
  INFO("losses: first " << losses[0] << ", " << losses[1] << "; last " << losses[148] << ", "
                        << losses[149]);
  CHECK(losses[148] + losses[149] < losses[0] + losses[1] - 2.0);

  // The checkpoint: the family, every layer MoE, windows on layers 0 and 2, alpha and limit, the
  // family's parameters (sinks f32, biases, the router's logit bias).
  const io::Checkpoint last = io::load_checkpoint(run + "/step-00000150.h5");
  const json& mc = last.model_config;
  CHECK(mc["arch"] == "gpt_oss");
  CHECK(mc["experts_per_layer"] == json{4, 4, 4});
  CHECK(mc["sliding_window"] == 4);
  CHECK(mc["window_layers"] == json{0, 2});
  CHECK(mc["swiglu_alpha"] == 1.702);
  CHECK(mc["swiglu_limit"] == 3.0);
  CHECK(mc["normalize_topk"] == true);
  CHECK(mc["router_scoring"] == "softmax");
  CHECK(mc["head_dim"] == 6);
  CHECK(mc["rope_type"] == "yarn");
  CHECK(mc["yarn"]["truncate"] == false);  // HF gpt-oss's YaRN
  CHECK(to_json(model_config_from_json(mc)) == mc);
  int found = 0;
  for (const io::NamedTensor& p : last.params) {
    if (p.name == "blocks.1.attn.sinks") {
      CHECK(p.tensor.shape() == Shape{4});
      CHECK(p.tensor.dtype() == DType::f32);
      ++found;
    }
    if (p.name == "blocks.1.attn.o.bias" || p.name == "blocks.1.moe.router.logit_bias" ||
        p.name == "blocks.1.moe.experts.b1" || p.name == "blocks.1.moe.experts.b3" ||
        p.name == "blocks.1.moe.experts.b2")
      ++found;
  }
  CHECK(found == 6);

  // Resuming at step 75 gives step 150's parameters and optimizer state bit for bit.
  auto re = run_command(tool("moe-train", "--resume " + run + "/step-00000075.h5 --out " + resumed +
                                              " --steps 150 --threads 1 -q"));
  INFO(re.err);
  REQUIRE(re.exit_code == 0);
  const io::Checkpoint again = io::load_checkpoint(resumed + "/step-00000150.h5");
  REQUIRE(again.params.size() == last.params.size());
  for (size_t i = 0; i < last.params.size(); ++i) {
    INFO(last.params[i].name);
    REQUIRE(again.params[i].name == last.params[i].name);
    CHECK(std::memcmp(again.params[i].tensor.raw(), last.params[i].tensor.raw(),
                      last.params[i].tensor.nbytes()) == 0);
  }
  REQUIRE(again.optim.size() == last.optim.size());
  for (size_t i = 0; i < last.optim.size(); ++i)
    CHECK(std::memcmp(again.optim[i].tensor.raw(), last.optim[i].tensor.raw(),
                      last.optim[i].tensor.nbytes()) == 0);

  // moe-infer scores the 8 windows as the trainer's final evaluation did (the same windows, the
  // same f32 model and kernels: equal up to the order of the final mean).
  auto s = run_command(
      tool("moe-infer", "score --model " + run + " --data " + val + " --batch 4 --threads 1"));
  INFO(s.err);
  REQUIRE(s.exit_code == 0);
  const std::vector<json> rows = json_lines(s.out);
  REQUIRE(rows.size() == 8);
  double sum = 0;
  for (const json& row : rows) sum += row["nll_mean"].get<double>();
  REQUIRE(std::isfinite(val_loss));
  CHECK(sum / 8 == Approx(val_loss).epsilon(1e-6));

  // moe-infer generate decodes through the cache (the windows and sinks included) past the
  // window: its greedy tokens are the uncached forward's.
  const std::string prompt = "Linux is";
  const std::string prompts = dir / "prompts.txt";
  test::write_file(prompts, prompt + "\n");
  auto g = run_command(tool("moe-infer", "generate -q --threads 1 --model " + run + " --prompts " +
                                             prompts + " --max-new 6"));
  INFO(g.err);
  REQUIRE(g.exit_code == 0);
  const std::vector<json> out = json_lines(g.out);
  REQUIRE(out.size() == 1);
  infer::LoadedModel loaded = infer::load_model(run + "/last.h5");
  const std::vector<int32_t> ids(prompt.begin(), prompt.end());  // byte-level: a byte a token
  CHECK(out[0].at("completion_ids").get<std::vector<int32_t>>() ==
        greedy_uncached(*loaded.model, ids, 6));
}

TEST_CASE("cli: bad gpt_oss flags are refused by name", "[cli][gpt_oss]") {
  test::ScratchDir dir("cli-train-gpt-oss-bad");
  const std::string args = "--data " + test::fortunes_path("linux") + " --out " + (dir / "run");
  struct Case {
    std::string flags, message;
  };
  const std::vector<Case> cases = {
      {" --arch mixtral --swiglu-alpha 2",
       "--swiglu-alpha is gpt_oss's (its clamped SwiGLU): it needs --arch gpt_oss, not --arch "
       "mixtral"},
      {" --arch qwen3_moe --swiglu-limit 7", "--swiglu-limit is gpt_oss's"},  // even the default
      {" --arch gpt_oss --swiglu-limit 0",
       "--swiglu-limit (the clamped SwiGLU's clamp) must be a finite number > 0 (got 0)"},
      {" --arch gpt_oss --swiglu-alpha -1", "--swiglu-alpha (the clamped SwiGLU's sigmoid slope)"},
      {" --arch gpt_oss --moe-every 2",
       "gpt_oss has experts in every layer; layer 0 is dense (give --moe-every 1)"},
      {" --arch gpt_oss --shared-expert-ff 8", "gpt_oss has no --shared-expert-ff"},
      {" --arch gpt_oss --residual-moe", "gpt_oss has no --residual-moe"},
  };
  for (const Case& c : cases) {
    INFO(c.flags);
    auto r = run_command(tool("moe-train", args + c.flags + " --steps 1 --threads 1"));
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("moe-train: error: ") != std::string::npos);
    CHECK(r.err.find(c.message) != std::string::npos);
    CHECK(r.err.find("terminate") == std::string::npos);
  }
  // A checkpoint's model: the flags need the --arch they belong to, then agree with it or are
  // refused naming the checkpoint's value.
  const std::string ckpt =
      test::train_on_fortunes(dir / "tiny",
                              " --arch gpt_oss --layers 2 --d-model 16 --heads 2"
                              " --d-ff 16 --seq 16 --experts 4 --batch 4 --threads 1"
                              " -q --swiglu-limit 3 --steps 1");
  const std::string again = " --out " + dir / "again" + " --steps 2 --threads 1";
  auto r = run_command(tool("moe-train", "--resume " + ckpt + again + " --swiglu-limit 5"));
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--swiglu-limit is gpt_oss's (its clamped SwiGLU): it needs --arch gpt_oss, "
                   "not --arch gpt (with --resume or --init, give --arch gpt_oss too)") !=
        std::string::npos);
  r = run_command(
      tool("moe-train", "--resume " + ckpt + again + " --arch gpt_oss --swiglu-limit 5"));
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--swiglu-limit 5.0 contradicts the checkpoint's 3.0") != std::string::npos);
  r = run_command(
      tool("moe-train", "--resume " + ckpt + again + " --arch gpt_oss --swiglu-limit 3"));
  INFO(r.err);
  CHECK(r.exit_code == 0);

  // The flags and the family are in --help.
  auto h = run_command(tool("moe-train", "--help"));
  REQUIRE(h.exit_code == 0);
  for (const char* s : {"gpt_oss", "--swiglu-alpha", "swiglu_alpha", "--swiglu-limit",
                        "swiglu_limit", "layer_types"}) {
    INFO(s);
    CHECK(h.out.find(s) != std::string::npos);
  }
}

// Serving under expert parallelism (plan Q2): moe-infer score --ep 2 on two ranks, each holding
// two of a layer's four experts with their biases and every rank the sinks, the attention biases
// and the router's logit bias, scores each window as one process does. Tolerance as
// test_score_ep_cli.cpp's: an expert's GEMM holds other rows than in one process and may round
// differently (a few f32 ulps of the logits); a window's mean NLL moves by at most twice the
// largest logit change: 1e-5 nats (a wrong expert, bias or sink is off by far more).
TEST_CASE("cli: a trained gpt_oss scores under --ep as in one process", "[cli][gpt_oss][ep]") {
  REQUIRE(run_command("command -v mpiexec").exit_code == 0);  // scripts/setup installs it
  test::ScratchDir dir("cli-gpt-oss-ep");
  const std::string ckpt =
      test::train_on_fortunes(dir / "run", kTiny + " --steps 30 --lr 1e-2 --warmup 1");
  const std::string args = "score --model " + ckpt + " --data " + test::fortunes_path("linux") +
                           " --batch 2 --max-sequences 8 -q --threads 1";
  const auto one = run_command(tool("moe-infer", args));
  INFO(one.err);
  REQUIRE(one.exit_code == 0);
  const auto ep = run_command("OMP_NUM_THREADS=1 timeout 120 mpiexec -n 2 " +
                              tool("moe-infer", args + " --ep 2"));
  INFO(ep.err);
  REQUIRE(ep.exit_code == 0);
  const std::vector<json> a = json_lines(one.out), b = json_lines(ep.out);
  REQUIRE(a.size() == 8);
  REQUIRE(b.size() == 8);
  for (size_t w = 0; w < a.size(); ++w) {
    INFO("window " << w);
    REQUIRE(b[w]["index"] == a[w]["index"]);
    CHECK(std::fabs(b[w]["nll_mean"].get<double>() - a[w]["nll_mean"].get<double>()) <= 1e-5);
  }
}
