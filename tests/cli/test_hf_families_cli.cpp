// Qwen2-MoE, Qwen3-MoE and OLMoE through the tools, as a user meets them (issue 21): a tiny
// transformers-format directory of each family (support/hf_families.h: every tensor its classes
// create) with a real Qwen tokenizer.json beside it is imported by moe-convert import-hf, and
// moe-infer generate continues a text prompt through that tokenizer: the completion is the
// tokenizer's decoding of the ids, and the ids are the greedy continuation of the family's
// independent double-precision reference. export-hf then writes the family back, and a model
// trained with moe-train --arch <family> exports and imports bitwise.
// Shape letters: V vocabulary, T tokens.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"
#include "moe/io/tokenizer.h"
#include "support/greedy.h"
#include "moe/nn/router.h"
#include "support/hf_families.h"
#include "support/run.h"

using namespace moe;
using namespace moe::test::hf;
using test::lines_of;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

const std::string kQwenTokenizer =
    std::string(MOE_TEST_SOURCE_DIR) + "/tests/data/tokenizers/bpe-qwen";

// The reference's greedy continuation of `ids` by `n` tokens; each choice must win by a margin
// (relative to the logits' scale) that float rounding cannot overturn.
std::vector<int32_t> reference_greedy(const Tiny& t, const std::map<std::string, Tensor>& w,
                                      std::vector<int32_t> ids, int n) {
  return test::clear_greedy(std::move(ids), n, t.V, [&](const std::vector<int32_t>& x) {
    return hf_reference_logits(t, w, x, 1, static_cast<int64_t>(x.size()), t.norm_topk);
  });
}

}  // namespace

TEST_CASE("cli: an imported Qwen2-MoE, Qwen3-MoE and OLMoE generate text through the tokenizer",
          "[cli][hf]") {
  test::ScratchDir dir("cli-hf-families");
  const auto tok = io::load_tokenizer(kQwenTokenizer);
  const std::string prompt = "The quick brown fox";
  const std::vector<int32_t> prompt_ids = tok->encode(prompt, true);
  const std::string prompts = dir / "prompts.txt";
  test::write_file(prompts, prompt + "\n");
  for (const std::string family : {"qwen2_moe", "qwen3_moe", "olmoe"}) {
    INFO("family " << family);
    Tiny t = tiny_of(family);
    t.V = 704;  // room for the tokenizer's 700 ids
    const auto w = family_weights(t, 31);
    const std::string hf = dir / family, ckpt = dir / (family + ".h5");
    write_hf_dir(hf, family_config(t), w, 2);
    fs::copy_file(kQwenTokenizer + "/tokenizer.json", fs::path(hf) / "tokenizer.json");
    auto i = run_command(tool("moe-convert", "import-hf " + hf + " -o " + ckpt));
    INFO(i.err);
    REQUIRE(i.exit_code == 0);
    REQUIRE(i.err.find("imported a " + family + " checkpoint") != std::string::npos);
    REQUIRE(i.err.find("tokenizer kept: tokenizer.json") != std::string::npos);

    auto g = run_command(tool(
        "moe-infer", "generate -q --model " + ckpt + " --prompts " + prompts + " --max-new 5"));
    INFO(g.err);
    REQUIRE(g.exit_code == 0);
    const auto out = lines_of(g.out);
    REQUIRE(out.size() == 1);
    const nlohmann::json j = nlohmann::json::parse(out[0]);
    REQUIRE(j.at("prompt") == prompt);
    const auto ids = j.at("completion_ids").get<std::vector<int32_t>>();
    REQUIRE(ids == reference_greedy(t, w, prompt_ids, 5));
    // The tokenizer's decoding of the ids, as JSON carries it (a cut UTF-8 sequence of a random
    // model's bytes becomes U+FFFD).
    const nlohmann::json decoded = tok->decode(ids);
    REQUIRE(j.at("completion").dump() ==
            decoded.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));

    // And back out as the family, the tokenizer beside it.
    const std::string back = dir / (family + "-back");
    auto e = run_command(tool("moe-convert", "export-hf " + ckpt + " -o " + back));
    INFO(e.err);
    REQUIRE(e.exit_code == 0);
    REQUIRE(nlohmann::json::parse(test::read_file(back + "/config.json"))["model_type"] == family);
    REQUIRE(test::read_file(back + "/tokenizer.json") ==
            test::read_file(kQwenTokenizer + "/tokenizer.json"));
  }
}

TEST_CASE("cli: a model trained with --arch qwen2_moe, qwen3_moe or olmoe exports and imports",
          "[cli][hf]") {
  test::ScratchDir dir("cli-hf-trained");
  const std::map<std::string, std::string> flags = {
      {"qwen2_moe", " --shared-expert-ff 32"}, {"qwen3_moe", " --head-dim 16"}, {"olmoe", ""}};
  for (const auto& [family, extra] : flags) {
    INFO("family " << family);
    const std::string run = dir / family;
    const std::string ckpt = test::train_on_fortunes(
        run, " --arch " + family +
                 " --layers 2 --moe-every 1 --d-model 32 --heads 4 --kv-heads 2 --d-ff 32"
                 " --experts 4 --top-k 2 --batch 2 --seq 16 --steps 2 --eval-every 0"
                 " --threads 1 -q" +
                 extra);
    const std::string hf = dir / (family + "-hf"), back = dir / (family + "-back.h5");
    auto e = run_command(tool("moe-convert", "export-hf " + ckpt + " -o " + hf));
    INFO(e.err);
    REQUIRE(e.exit_code == 0);
    auto i = run_command(tool("moe-convert", "import-hf " + hf + " -o " + back));
    INFO(i.err);
    REQUIRE(i.exit_code == 0);
    const io::Checkpoint a = io::load_checkpoint(ckpt), b = io::load_checkpoint(back);
    // moe-train centres its routers (--router-center-rate): the export writes each router as the
    // plain weight its logits use, W' (nn::center_router_weight), and holds no center.
    const ModelConfig trained = model_config_from_json(a.model_config);
    REQUIRE(trained.router_center());
    REQUIRE(b.params.size() == a.params.size() - trained.moe_blocks().size());
    for (const io::NamedTensor& p : a.params) {
      INFO("parameter " << p.name);
      const std::string block = p.name.substr(0, p.name.find(".moe.router."));
      if (p.name.ends_with(".moe.router.center")) {
        for (const io::NamedTensor& q : b.params) REQUIRE(q.name != p.name);
      } else if (p.name.ends_with(".moe.router.weight")) {
        const Tensor folded =
            nn::center_router_weight(p.tensor, param(a, block + ".moe.router.center").tensor);
        REQUIRE(same_bytes(param(b, p.name).tensor, folded));
      } else {
        REQUIRE(same_bytes(param(b, p.name).tensor, p.tensor));
      }
    }
    const ModelConfig imported = model_config_from_json(b.model_config);
    REQUIRE(imported.arch == trained.arch);
    REQUIRE(imported.router_center_rate == 0);
  }
}
