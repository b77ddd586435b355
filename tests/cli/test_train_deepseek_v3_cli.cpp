// moe-train --arch deepseek_v3 as a user runs it (issue 44): a tiny DeepSeek-V3 (Multi-head
// Latent Attention with the latent shape moe-train picks when its flags are left out, a dense
// first layer, a shared expert, grouped sigmoid routing, YaRN with mscale_all_dim) trains the demo
// corpus with its loss falling, checkpoints the MLA and YaRN settings, resumes bit for bit, and
// moe-infer scores it as training evaluated it. Its decode cache holds the compressed latent
// (kv_lora_rank + qk_rope_dim floats a token a layer) and moe-infer generate's greedy tokens
// through it are the uncached forward's. A DeepSeek-V2-Lite shape (a plain q projection, softmax
// routing) trains from explicit flags, YaRN trains on mixtral's layers, and bad flags are refused
// by name before any work.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "moe/models/memory.h"
#include "moe/nn/attention.h"
#include "support/greedy.h"
#include "support/json_lines.h"
#include "support/run.h"

using namespace moe;
using nlohmann::json;
using test::json_lines;
using test::run_command;
using test::tool;

namespace {

// Two blocks (a dense one, then 4 experts in 2 groups with a shared expert), D 16, 2 heads.
const std::string kTiny =
    " --layers 2 --d-model 16 --heads 2 --d-ff 32 --seq 16 --batch 4 --threads 1 -q"
    " --experts-per-layer 0,4 --dense-ff 24 --shared-expert-ff 16 --top-k 2"
    " --router-groups 2 --router-group-topk 1 --routed-scale 2.5";

// YaRN as DeepSeek-V3 configures it (mscale = mscale_all_dim), over a context of twice the
// original: the RoPE pairs between the fast and slow corrections are interpolated.
const std::string kYarn =
    " --rope-scaling yarn --rope-factor 2 --original-max-position-embeddings 8"
    " --beta-fast 32 --beta-slow 1 --mscale 1 --mscale-all-dim 1";

// The uncached forward's greedy continuation of `ids` by `n` tokens (Transformer::logits over the
// whole sequence each step), with the cached path (a prefill of `ids`, then one token a step
// through the latent cache) walked beside it: each step's cached logits are the uncached ones
// with two sums a head regrouped (q . W_UK c as (q W_UK) . c, and the values' mix taken before
// W_UV), which moves them by ~1e-6 of the logits' scale (tests/unit/test_mla_cache.cpp derives
// the 2e-5 bound used here); a wrong head, scale, RoPE position or slot moves them O(1). Each
// greedy choice must win by 1e-4 of the scale, more than that rounding can overturn.
std::vector<int32_t> greedy_cached_and_not(const Transformer& model, std::vector<int32_t> ids,
                                           int n) {
  const int64_t V = model.config().vocab_size;
  KVCache cache = model.make_cache(1);
  const int64_t T0 = static_cast<int64_t>(ids.size());
  Tensor cached = model.forward_cached(Tensor::from_vector({1, T0}, ids), cache);
  std::vector<int32_t> out;
  for (int step = 0; step < n; ++step) {
    const int64_t T = static_cast<int64_t>(ids.size());
    const std::vector<float> all = model.logits(Tensor::from_vector({1, T}, ids)).to_vector();
    const float* last = all.data() + (T - 1) * V;
    const std::vector<float> got = cached.to_vector();
    REQUIRE(got.size() == static_cast<size_t>(V));
    float scale = 0, diff = 0;
    for (int64_t v = 0; v < V; ++v) {
      scale = std::max(scale, std::fabs(last[v]));
      diff = std::max(diff, std::fabs(got[v] - last[v]));
    }
    INFO("step " << step << ": cached logits off by " << diff);
    CHECK(diff <= 2e-5f * scale);
    const int32_t best = test::clear_argmax(last, V, step);
    out.push_back(best);
    ids.push_back(best);
    cached = model.forward_cached(Tensor::from_vector({1, 1}, std::vector<int32_t>{best}), cache);
  }
  return out;
}

}  // namespace

TEST_CASE("cli: moe-train --arch deepseek_v3 trains, resumes, scores and decodes its latent",
          "[cli][deepseek_v3]") {
  test::ScratchDir dir("cli-train-deepseek-v3");
  const std::string text = test::read_file(test::fortunes_path("linux"));
  const std::string val = dir / "val.txt";
  test::write_file(val, text.substr(2000, 8 * 16 + 1));  // 8 windows of 16 tokens (+1)
  const std::string run = dir / "run", resumed = dir / "resumed";
  auto r = run_command(
      tool("moe-train", "--data " + test::fortunes_path("linux") + " --val " + val + " --out " +
                            run + " --arch deepseek_v3" + kTiny + kYarn +
                            " --steps 150 --lr 1e-2 --warmup 1 --checkpoint-every 75 --eval-every 0"
                            " --eval-batches 2 --log-every 1 --metrics " +
                            run + "/metrics.jsonl"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);

  // The loss falls: the last two steps' mean a nat below the first two's (byte-level text from a
  // uniform start at ln 256 = 5.5 nats; 150 AdamW steps at 1e-2 take it below 3).
  std::vector<double> losses;
  double val_loss = NAN;
  for (const json& j : json_lines(test::read_file(run + "/metrics.jsonl"))) {
    if (j.contains("loss") && j.contains("step")) losses.push_back(j["loss"].get<double>());
    if (j.contains("val_loss")) val_loss = j["val_loss"].get<double>();
  }
  REQUIRE(losses.size() == 150);
  INFO("losses: first " << losses[0] << ", " << losses[1] << "; last " << losses[148] << ", "
                        << losses[149]);
  CHECK(losses[148] + losses[149] < losses[0] + losses[1] - 2.0);

  // The checkpoint holds the latent shape moe-train picked (D 16, H 2: q 8, kv 4, heads of 8 +
  // 4, values 8) and the YaRN settings, and the family's parameters of that shape.
  const io::Checkpoint last = io::load_checkpoint(run + "/step-00000150.h5");
  const json& mc = last.model_config;
  CHECK(mc["arch"] == "deepseek_v3");
  CHECK(mc["q_lora_rank"] == 8);
  CHECK(mc["kv_lora_rank"] == 4);
  CHECK(mc["qk_nope_dim"] == 8);
  CHECK(mc["qk_rope_dim"] == 4);
  CHECK(mc["v_head_dim"] == 8);
  CHECK(mc["router_scoring"] == "sigmoid");  // --router auto: the family's
  CHECK(mc["normalize_topk"] == true);
  CHECK(mc["rope_type"] == "yarn");
  CHECK(mc["yarn"] == json{{"factor", 2.0},
                           {"original_ctx", 8.0},
                           {"beta_fast", 32.0},
                           {"beta_slow", 1.0},
                           {"mscale", 1.0},
                           {"mscale_all_dim", 1.0},
                           {"attention_factor", 0.0},
                           {"truncate", true}});
  const ModelConfig config = model_config_from_json(mc);  // and reads back as written
  CHECK(to_json(config) == mc);
  CHECK(config.attention_scale() > 1.0);  // mscale_all_dim reached the softmax scale

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

  // The decode cache of the trained model holds the latent: kv_lora_rank + qk_rope_dim floats a
  // token a layer, not the 2 H (qk_nope + qk_rope) of full keys and padded values.
  infer::LoadedModel loaded = infer::load_model(run + "/last.h5");
  const KVCache cache = loaded.model->make_cache(1, 16);
  REQUIRE(cache.blocks.size() == 2);
  for (const nn::AttentionCache& block : cache.blocks) {
    CHECK(block.latent.shape() == Shape{1, 16, 4 + 4});
    CHECK(block.bytes_per_token() == (4 + 4) * int64_t(sizeof(float)));
    CHECK_FALSE(block.k.defined());
    CHECK_FALSE(block.v.defined());
  }
  CHECK(kv_cache_bytes_per_token(loaded.config) == 2 * (4 + 4) * sizeof(float));

  // moe-infer generate decodes through that cache; its greedy tokens are the uncached forward's
  // (" te te" and such after 150 steps: not one token repeated).
  const std::string prompt = "Linux is";
  const std::string prompts = dir / "prompts.txt";
  test::write_file(prompts, prompt + "\n");
  auto g = run_command(tool("moe-infer", "generate -q --threads 1 --model " + run + " --prompts " +
                                             prompts + " --max-new 6"));
  INFO(g.err);
  REQUIRE(g.exit_code == 0);
  const std::vector<json> out = json_lines(g.out);
  REQUIRE(out.size() == 1);
  const std::vector<int32_t> ids(prompt.begin(), prompt.end());  // byte-level: a byte a token
  CHECK(out[0].at("completion_ids").get<std::vector<int32_t>>() ==
        greedy_cached_and_not(*loaded.model, ids, 6));
}

TEST_CASE("cli: deepseek_v3's latent shape from flags, and YaRN on mixtral's layers",
          "[cli][deepseek_v3]") {
  test::ScratchDir dir("cli-train-deepseek-v2-lite");
  const std::string data = "--data " + test::fortunes_path("linux");
  // DeepSeek-V2-Lite's shape: no q latent (a plain q projection), softmax routing.
  auto r =
      run_command(tool("moe-train", data + " --out " + dir / "v2" + " --arch deepseek_v3" + kTiny +
                                        " --q-lora-rank 0 --kv-lora-rank 6 --qk-nope-dim 4"
                                        " --qk-rope-dim 2 --v-head-dim 5 --router softmax"
                                        " --steps 1"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const io::Checkpoint v2 = io::load_checkpoint(dir / "v2/last.h5");
  const json& mc = v2.model_config;
  CHECK(mc["q_lora_rank"] == 0);
  CHECK(mc["kv_lora_rank"] == 6);
  CHECK(mc["qk_nope_dim"] == 4);
  CHECK(mc["qk_rope_dim"] == 2);
  CHECK(mc["v_head_dim"] == 5);
  CHECK(mc["router_scoring"] == "softmax");
  CHECK_FALSE(mc.contains("rope_type"));  // no RoPE scaling: the file as before YaRN existed
  bool plain_q = false;
  for (const io::NamedTensor& p : v2.params) {
    CHECK(p.name.find("q_a") == std::string::npos);  // no q latent
    if (p.name == "blocks.0.attn.q.weight") plain_q = p.tensor.shape() == Shape{2 * (4 + 2), 16};
  }
  CHECK(plain_q);

  // YaRN is the RoPE families' too, not only deepseek_v3's.
  auto y = run_command(tool(
      "moe-train", data + " --out " + dir / "mixtral" + test::kTinyMixtral + kYarn + " --steps 1"));
  INFO(y.err);
  REQUIRE(y.exit_code == 0);
  const io::Checkpoint m = io::load_checkpoint(dir / "mixtral/last.h5");
  CHECK(m.model_config["rope_type"] == "yarn");
  CHECK(m.model_config["yarn"]["factor"] == 2.0);
  CHECK(m.model_config["yarn"]["original_ctx"] == 8.0);

  // The flags are in --help, each saying the HF key it mirrors.
  auto h = run_command(tool("moe-train", "--help"));
  REQUIRE(h.exit_code == 0);
  for (const char* s : {"--q-lora-rank",
                        "q_lora_rank",
                        "--kv-lora-rank",
                        "kv_lora_rank",
                        "--qk-nope-dim",
                        "qk_nope_head_dim",
                        "--qk-rope-dim",
                        "qk_rope_head_dim",
                        "--v-head-dim",
                        "v_head_dim",
                        "--rope-scaling",
                        "--rope-factor",
                        "--original-max-position-embeddings",
                        "original_max_position_embeddings",
                        "--beta-fast",
                        "--beta-slow",
                        "--mscale",
                        "--mscale-all-dim",
                        "mscale_all_dim",
                        "deepseek_v3"}) {
    INFO(s);
    CHECK(h.out.find(s) != std::string::npos);
  }
}

TEST_CASE("cli: bad latent attention and YaRN flags are refused by name", "[cli][deepseek_v3]") {
  test::ScratchDir dir("cli-train-deepseek-v3-bad");
  const std::string args = "--data " + test::fortunes_path("linux") + " --out " + (dir / "run");
  const std::string ds = " --arch deepseek_v3";
  const std::string yarn = " --arch mixtral --rope-scaling yarn";
  struct Case {
    std::string flags, message;
  };
  const std::vector<Case> cases = {
      {" --arch mixtral --kv-lora-rank 8",
       "--kv-lora-rank is deepseek_v3's (Multi-head Latent Attention): it needs --arch "
       "deepseek_v3, not --arch mixtral"},
      {" --q-lora-rank 8", "--q-lora-rank is deepseek_v3's"},
      {ds + " --qk-rope-dim 3", "--qk-rope-dim must be even and >= 2"},
      {ds + " --qk-rope-dim 0", "--qk-rope-dim must be even and >= 2"},
      {ds + " --kv-lora-rank 0", "--kv-lora-rank must be >= 1 with --arch deepseek_v3"},
      {ds + " --q-lora-rank -1", "--q-lora-rank must be >= 0"},
      {ds + " --qk-nope-dim 0", "--qk-nope-dim must be >= 1"},
      {ds + " --qk-nope-dim 4 --qk-rope-dim 2 --v-head-dim 7",
       "--v-head-dim must be between 1 and --qk-nope-dim + --qk-rope-dim = 6 (got 7)"},
      {ds + " --head-dim 8", "--head-dim does not apply to --arch deepseek_v3"},
      {ds + " --rope-dim 2", "--rope-dim does not apply to --arch deepseek_v3"},
      {ds + " --kv-heads 1 --heads 4", "--kv-heads does not apply to --arch deepseek_v3"},
      {ds + " --qk-norm", "--qk-norm does not apply to --arch deepseek_v3"},
      {" --arch mixtral --rope-factor 4",
       "--rope-factor is a YaRN setting: add --rope-scaling yarn"},
      {" --arch mixtral --mscale-all-dim 1", "--mscale-all-dim is a YaRN setting"},
      {" --rope-scaling yarn --original-max-position-embeddings 8",
       "--rope-scaling yarn needs a RoPE architecture: --arch gpt has learned positions"},
      {yarn, "--rope-scaling yarn needs --original-max-position-embeddings"},
      {yarn + " --original-max-position-embeddings 8 --rope-factor 0.5",
       "--rope-factor must be >= 1 (got 0.5)"},
      {yarn + " --original-max-position-embeddings 0",
       "--original-max-position-embeddings must "
       "be >= 1 position (got 0)"},
      {yarn + " --original-max-position-embeddings 8 --beta-slow 0", "--beta-slow must be > 0"},
      {yarn + " --original-max-position-embeddings 8 --mscale -1", "--mscale must be >= 0"},
      {" --rope-scaling linear", "--rope-scaling"},
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

  // A checkpoint keeps its RoPE: a YaRN flag beside --resume or --init must agree with the
  // checkpoint's (its key in the model config's yarn object), as every model flag; one that
  // contradicts it is refused by name with both values, not ignored.
  const std::string plain =
      test::train_on_fortunes(dir / "mixtral", test::kTinyMixtral + " --steps 1");
  const std::string yarned =
      test::train_on_fortunes(dir / "yarn", test::kTinyMixtral + kYarn + " --steps 1");
  const std::string data = " --data " + test::fortunes_path("linux");
  for (const std::string from : {"--resume", "--init"}) {
    INFO(from);
    auto again = [&](const std::string& ckpt, const std::string& out, const std::string& flags) {
      return run_command(tool("moe-train", from + " " + ckpt + data + " --out " + dir / out +
                                               " --steps 2 --threads 1 -q" + flags));
    };
    auto agreed = again(yarned, from.substr(2) + "-agreed", kYarn);
    INFO(agreed.err);
    REQUIRE(agreed.exit_code == 0);
    const io::Checkpoint trained = io::load_checkpoint(dir / (from.substr(2) + "-agreed/last.h5"));
    CHECK(trained.model_config["rope_type"] == "yarn");
    CHECK(trained.model_config["yarn"]["factor"] == 2.0);
    auto r = again(yarned, from.substr(2) + "-factor", " --rope-factor 4");
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--rope-factor 4.0 contradicts the checkpoint's 2.0") != std::string::npos);
    auto p = again(plain, from.substr(2) + "-plain", " --rope-factor 2");
    INFO(p.err);
    CHECK(p.exit_code == 2);
    CHECK(p.err.find("--rope-factor 2.0 contradicts the checkpoint's off") != std::string::npos);
  }
}
