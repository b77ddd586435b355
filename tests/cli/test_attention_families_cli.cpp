// moe-train --arch qwen3_moe / olmoe / qwen2_moe / glm4_moe as a user runs it: a tiny model of
// each family trains, its checkpoint holds the family's attention parameters (qk-norm, q/k/v
// biases, head_dim; glm4_moe's options given as flags, with its dense first layer, shared expert
// and grouped sigmoid routing), resumes bit for bit, and moe-infer scores it as training evaluated
// it; bad --head-dim and GLM option values are refused by name.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "moe/io/checkpoint.h"
#include "support/run.h"

using namespace moe;
using test::lines_of;
using test::run_command;
using test::tool;

namespace {

// Two blocks of 4 experts, D 16, 2 query heads over 1 kv head, one thread.
const std::string kTiny =
    " --layers 2 --d-model 16 --heads 2 --kv-heads 1 --d-ff 32 --seq 16 --experts 4"
    " --moe-every 1 --batch 4 --threads 1 -q";

const std::string kGlm =
    " --experts-per-layer 0,4 --dense-ff 24 --rope-dim 4 --qkv-bias --qk-norm"
    " --shared-expert-ff 32 --router-groups 2 --router-group-topk 1 --routed-scale 2.5";

const io::NamedTensor* find_param(const io::Checkpoint& c, const std::string& name) {
  for (const io::NamedTensor& p : c.params)
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace

TEST_CASE("cli: the HF families' attention trains, resumes and scores", "[cli]") {
  struct Family {
    std::string arch, flags;
    int64_t hd;              // head dim
    int64_t q_norm, k_norm;  // widths of the qk-norm weights (0: none)
    bool qkv_bias;           // q/k/v biases (never an o bias)
  };
  const std::vector<Family> families = {
      {"qwen3_moe", " --head-dim 12", 12, 12, 12, false},  // H*hd 24 > D 16, per-head norm
      {"olmoe", "", 8, 16, 8, false},                      // full width: H*hd and KV*hd
      {"qwen2_moe", "", 8, 0, 0, true},                    // default --shared-expert-ff 0
      // Issue 44 (c): every GLM-4-MoE option as a flag (there were none). A dense first layer of
      // its own width, partial RoPE, q/k/v biases, per-head qk-norm, a shared expert, sigmoid
      // routing (the family's, --router auto) in 1 of 2 groups, scaled gate weights.
      {"glm4_moe", kGlm, 8, 8, 8, true},
  };
  test::ScratchDir dir("cli-attention-families");
  // 12 windows of 16 tokens (+1): the trainer's final evaluation (batch 4, 3 batches) and
  // moe-infer score read the same windows.
  const std::string text = test::read_file(test::fortunes_path("linux"));
  const std::string val = dir / "val.txt";
  test::write_file(val, text.substr(2000, 12 * 16 + 1));
  for (const Family& f : families) {
    INFO(f.arch);
    const std::string run = dir / f.arch, resumed = dir / (f.arch + "-resumed");
    auto r =
        run_command(tool("moe-train", "--data " + test::fortunes_path("linux") + " --val " + val +
                                          " --out " + run + " --arch " + f.arch + f.flags + kTiny +
                                          " --steps 4 --checkpoint-every 2 --eval-every 0"
                                          " --eval-batches 3 --metrics " +
                                          run + "/metrics.jsonl"));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);

    const io::Checkpoint last = io::load_checkpoint(run + "/step-00000004.h5");
    for (int block = 0; block < 2; ++block) {
      const std::string attn = "blocks." + std::to_string(block) + ".attn.";
      INFO(attn);
      REQUIRE(find_param(last, attn + "q.weight"));
      CHECK(find_param(last, attn + "q.weight")->tensor.shape() == Shape{2 * f.hd, 16});
      CHECK(find_param(last, attn + "k.weight")->tensor.shape() == Shape{f.hd, 16});
      CHECK(find_param(last, attn + "o.weight")->tensor.shape() == Shape{16, 2 * f.hd});
      CHECK(find_param(last, attn + "o.bias") == nullptr);
      if (f.qkv_bias) {
        REQUIRE(find_param(last, attn + "q.bias"));
        CHECK(find_param(last, attn + "q.bias")->tensor.shape() == Shape{2 * f.hd});
        CHECK(find_param(last, attn + "v.bias")->tensor.shape() == Shape{f.hd});
      } else {
        CHECK(find_param(last, attn + "q.bias") == nullptr);
      }
      if (f.q_norm) {
        REQUIRE(find_param(last, attn + "q_norm.weight"));
        REQUIRE(find_param(last, attn + "k_norm.weight"));
        CHECK(find_param(last, attn + "q_norm.weight")->tensor.shape() == Shape{f.q_norm});
        CHECK(find_param(last, attn + "k_norm.weight")->tensor.shape() == Shape{f.k_norm});
        // Trained: four AdamW steps moved the weights off their initial ones.
        const std::vector<float> w = find_param(last, attn + "q_norm.weight")->tensor.to_vector();
        CHECK(std::any_of(w.begin(), w.end(), [](float x) { return x != 1.0f; }));
      } else {
        CHECK(find_param(last, attn + "q_norm.weight") == nullptr);
      }
    }

    if (f.arch == "glm4_moe") {  // the options reached the model
      const nlohmann::json mc = last.model_config;
      CHECK(mc["experts_per_layer"] == nlohmann::json{0, 4});
      CHECK(mc["dense_ff"] == 24);
      CHECK(mc["rope_dim"] == 4);
      CHECK(mc["router_groups"] == 2);
      CHECK(mc["router_group_topk"] == 1);
      CHECK(mc["routed_scale"] == 2.5);
      CHECK(mc["router_scoring"] == "sigmoid");
      REQUIRE(find_param(last, "blocks.0.mlp.w1"));
      CHECK(find_param(last, "blocks.0.mlp.w1")->tensor.shape() == Shape{24, 16});
      REQUIRE(find_param(last, "blocks.1.moe.shared.w1"));
      CHECK(find_param(last, "blocks.1.moe.shared.w1")->tensor.shape() == Shape{32, 16});
      CHECK(find_param(last, "blocks.1.moe.router.bias"));
    }

    // Resuming at step 2 gives step 4's parameters bit for bit.
    auto re = run_command(tool("moe-train", "--resume " + run + "/step-00000002.h5 --out " +
                                                resumed + " --steps 4 --threads 1 -q"));
    INFO(re.err);
    REQUIRE(re.exit_code == 0);
    const io::Checkpoint again = io::load_checkpoint(resumed + "/step-00000004.h5");
    REQUIRE(again.params.size() == last.params.size());
    for (size_t i = 0; i < last.params.size(); ++i) {
      INFO(last.params[i].name);
      REQUIRE(again.params[i].name == last.params[i].name);
      CHECK(std::memcmp(again.params[i].tensor.raw(), last.params[i].tensor.raw(),
                        last.params[i].tensor.nbytes()) == 0);
    }

    // moe-infer scores the 12 windows as the trainer's final evaluation did.
    auto s = run_command(
        tool("moe-infer", "score --model " + run + " --data " + val + " --batch 4 --threads 1"));
    INFO(s.err);
    REQUIRE(s.exit_code == 0);
    const std::vector<std::string> rows = lines_of(s.out);
    REQUIRE(rows.size() == 12);
    double sum = 0;
    for (const std::string& row : rows) sum += nlohmann::json::parse(row)["nll_mean"].get<double>();
    const std::vector<std::string> metrics = lines_of(test::read_file(run + "/metrics.jsonl"));
    const double val_loss = nlohmann::json::parse(metrics.back())["val_loss"].get<double>();
    CHECK(std::isfinite(val_loss));
    CHECK(sum / 12 == Approx(val_loss).epsilon(1e-6));
  }
}

TEST_CASE("cli: bad --head-dim values are refused by name", "[cli]") {
  test::ScratchDir dir("cli-attention-bad");
  const std::string args = "--data " + test::fortunes_path("linux") + " --out " + (dir / "run");
  struct Case {
    std::string flags, message;
  };
  const std::vector<Case> cases = {
      {" --arch qwen3_moe --head-dim 5", "RoPE needs an even head dimension (got 5)"},
      {" --arch olmoe --head-dim -4", "--head-dim must be >= 0"},
      {" --arch mixtral --d-model 12 --heads 4", "RoPE needs an even head dimension (got 3)"},
      {" --arch gpt --head-dim 8", "--head-dim needs a RoPE architecture"},
      // Issue 44 (c): the GLM-4-MoE options, checked before any work.
      {" --arch mixtral --qkv-bias", "--qkv-bias and --qk-norm are glm4_moe's options; --arch "
                                     "mixtral fixes its attention"},
      {" --arch qwen2_moe --qk-norm", "--qkv-bias and --qk-norm are glm4_moe's options"},
      {" --arch glm4_moe --rope-dim 3", "--rope-dim (the rotated features of a head) must be "
                                        "even and at most its 32"},
      {" --arch glm4_moe --dense-ff -1", "--dense-ff (the dense layers' width) must be >= 0"},
      {" --arch glm4_moe --routed-scale 0", "--routed-scale (the routed experts' scale) must be a "
                                            "finite number > 0"},
      {" --arch glm4_moe --router-groups 2 --router-group-topk 3",
       "--router-groups must be 1..64 with --router-group-topk 1..groups"},
      {" --arch glm4_moe --router-groups 3", "experts do not form 3 groups"},
  };
  for (const Case& c : cases) {
    INFO(c.flags);
    auto r = run_command(tool("moe-train", args + c.flags + " --steps 1 --threads 1"));
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("moe-train: error: ") != std::string::npos);
    CHECK(r.err.find(c.message) != std::string::npos);
  }
}
