// GLM-4-MoE through the tools, as a user meets it: a tiny transformers-format Glm4MoeForCausalLM
// directory (support/hf_glm4_moe.h: every tensor the class creates, n_group > 1) with a real
// tokenizer.json beside it is imported by moe-convert import-hf; moe-infer generate continues a
// text prompt with the greedy continuation of the independent double-precision reference;
// export-hf writes the family back; export-gguf writes llama.cpp's glm4moe architecture (its keys
// and tensor names, read back here by our own GGUF reader; tests/cli/scripts/gguf_readback.sh
// reads such a file with llama.cpp's gguf package), and refuses what glm4moe cannot hold by name.
// Shape letters: V vocabulary, T tokens.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "moe/io/gguf.h"
#include "moe/io/tokenizer.h"
#include "support/greedy.h"
#include "support/hf_glm4_moe.h"
#include "support/run.h"

using namespace moe;
using namespace moe::test::hf;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

// The reference's greedy continuation of `ids` by `n` tokens, each choice winning by a margin
// (relative to the logits' scale) that float rounding cannot overturn.
std::vector<int32_t> glm_greedy(const TinyGlm& t, const std::map<std::string, Tensor>& w,
                                std::vector<int32_t> ids, int n) {
  return test::clear_greedy(std::move(ids), n, t.V, [&](const std::vector<int32_t>& x) {
    return glm_reference_logits(t, w, x, 1, static_cast<int64_t>(x.size()));
  });
}

}  // namespace

TEST_CASE("cli: an imported GLM-4-MoE generates and exports back", "[cli][hf][glm4_moe]") {
  test::ScratchDir dir("cli-hf-glm4-moe");
  const std::string tokenizer =
      std::string(MOE_TEST_SOURCE_DIR) + "/tests/data/tokenizers/bpe-qwen";
  const auto tok = io::load_tokenizer(tokenizer);
  const std::string prompt = "The quick brown fox";
  const std::string prompts = dir / "prompts.txt";
  test::write_file(prompts, prompt + "\n");
  TinyGlm t;
  t.V = 704;  // room for the tokenizer's 700 ids
  const auto w = glm_weights(t, 41);
  const std::string hf = dir / "glm", ckpt = dir / "glm.h5";
  write_hf_dir(hf, glm_config(t), w, 2);
  fs::copy_file(tokenizer + "/tokenizer.json", fs::path(hf) / "tokenizer.json");
  auto i = run_command(tool("moe-convert", "import-hf " + hf + " -o " + ckpt));
  INFO(i.err);
  REQUIRE(i.exit_code == 0);
  REQUIRE(i.err.find("imported a glm4_moe checkpoint") != std::string::npos);

  auto g = run_command(
      tool("moe-infer", "generate -q --model " + ckpt + " --prompts " + prompts + " --max-new 5"));
  INFO(g.err);
  REQUIRE(g.exit_code == 0);
  const auto out = test::lines_of(g.out);
  REQUIRE(out.size() == 1);
  const nlohmann::json j = nlohmann::json::parse(out[0]);
  REQUIRE(j.at("completion_ids").get<std::vector<int32_t>>() ==
          glm_greedy(t, w, tok->encode(prompt, true), 5));

  const std::string back = dir / "glm-back";
  auto e = run_command(tool("moe-convert", "export-hf " + ckpt + " -o " + back));
  INFO(e.err);
  REQUIRE(e.exit_code == 0);
  const nlohmann::json c = nlohmann::json::parse(test::read_file(back + "/config.json"));
  REQUIRE(c["model_type"] == "glm4_moe");
  REQUIRE(c["n_group"] == t.groups);
  REQUIRE(c["first_k_dense_replace"] == t.dense);
}

namespace {

// Imports the tiny GLM-4-MoE `t` (weights seeded 43) into DIR/NAME.h5.
std::string import_glm(const test::ScratchDir& dir, const std::string& name, const TinyGlm& t,
                       std::map<std::string, Tensor>& w) {
  w = glm_weights(t, 43);
  const std::string hf = dir / name, ckpt = dir / (name + ".h5");
  write_hf_dir(hf, glm_config(t), w, 1);
  auto i = run_command(tool("moe-convert", "import-hf " + hf + " -o " + ckpt));
  INFO(i.err);
  REQUIRE(i.exit_code == 0);
  return ckpt;
}

int64_t key_int(const io::GgufFile& g, const std::string& key) {
  INFO(key);
  REQUIRE(g.metadata.contains(key));
  return g.metadata[key]["value"].get<int64_t>();
}

}  // namespace

// The names and keys are llama.cpp's (src/models/glm4-moe.cpp reads them, its converter's
// Glm4MoeModel writes them); the values those of the HF directory the checkpoint came from.
TEST_CASE("cli: export-gguf writes a GLM-4-MoE as llama.cpp's glm4moe", "[cli][gguf][glm4_moe]") {
  test::ScratchDir dir("cli-gguf-glm4-moe");
  TinyGlm t;  // 3 layers, the first dense; 2 of 4 groups; partial RoPE; biases; qk-norm
  std::map<std::string, Tensor> w;
  const std::string ckpt = import_glm(dir, "glm", t, w), out = dir / "glm.gguf";
  auto e = run_command(tool("moe-convert", "export-gguf " + ckpt + " -o " + out + " --type f32"));
  INFO(e.err);
  REQUIRE(e.exit_code == 0);
  const io::GgufFile g = io::read_gguf(out);
  REQUIRE(g.metadata["general.architecture"]["value"] == "glm4moe");
  REQUIRE(key_int(g, "glm4moe.block_count") == t.L);
  REQUIRE(key_int(g, "glm4moe.feed_forward_length") == t.Fd);
  REQUIRE(key_int(g, "glm4moe.expert_feed_forward_length") == t.F);
  REQUIRE(key_int(g, "glm4moe.expert_count") == t.E);
  REQUIRE(key_int(g, "glm4moe.expert_used_count") == t.k);
  REQUIRE(key_int(g, "glm4moe.expert_shared_count") == t.shared);
  REQUIRE(key_int(g, "glm4moe.leading_dense_block_count") == t.dense);
  REQUIRE(key_int(g, "glm4moe.expert_group_count") == t.groups);
  REQUIRE(key_int(g, "glm4moe.expert_group_used_count") == t.group_k);
  REQUIRE(key_int(g, "glm4moe.expert_gating_func") == 2);  // sigmoid
  REQUIRE(key_int(g, "glm4moe.rope.dimension_count") == t.rd());
  REQUIRE(key_int(g, "glm4moe.attention.key_length") == t.hd);
  REQUIRE(g.metadata["glm4moe.expert_weights_scale"]["value"].get<double>() == t.scale);
  REQUIRE(g.metadata["glm4moe.expert_weights_norm"]["value"].get<bool>() == t.norm_topk);
  REQUIRE_FALSE(g.metadata.contains("glm4moe.expert_shared_feed_forward_length"));

  auto dims = [&](const std::string& name) { return g.tensor(name).dims; };
  using Dims = std::vector<int64_t>;
  REQUIRE(dims("blk.0.ffn_gate.weight") == Dims{t.D, t.Fd});
  REQUIRE(dims("blk.0.ffn_down.weight") == Dims{t.Fd, t.D});
  REQUIRE(dims("blk.0.ffn_up.weight") == Dims{t.D, t.Fd});
  REQUIRE(dims("blk.1.ffn_gate_inp.weight") == Dims{t.D, t.E});
  REQUIRE(dims("blk.2.exp_probs_b.bias") == Dims{t.E});
  REQUIRE(dims("blk.2.ffn_gate_exps.weight") == Dims{t.D, t.F, t.E});
  REQUIRE(dims("blk.2.ffn_down_shexp.weight") == Dims{t.shared * t.F, t.D});
  REQUIRE(dims("blk.1.attn_q.bias") == Dims{t.H * t.hd});
  REQUIRE(dims("blk.1.attn_k_norm.weight") == Dims{t.hd});
  REQUIRE(dims("blk.0.post_attention_norm.weight") == Dims{t.D});
  std::set<std::string> names;
  for (const io::GgufTensorInfo& info : g.tensors) names.insert(info.name);
  for (const char* absent : {"blk.0.ffn_gate_inp.weight", "blk.0.exp_probs_b.bias",
                             "blk.1.ffn_norm.weight", "blk.1.ffn_gate_inp_shexp.weight"})
    REQUIRE_FALSE(names.count(absent));
  // 19 a MoE layer, 14 a dense one; the embedding, final norm and head
  REQUIRE(g.tensors.size() == static_cast<size_t>(14 * t.dense + 19 * (t.L - t.dense) + 3));
  // Values as the HF directory holds them: the correction bias, and q's rows unpermuted (NEOX)
  REQUIRE(io::read_gguf_tensor(g, "blk.2.exp_probs_b.bias") ==
          w.at("model.layers.2.mlp.gate.e_score_correction_bias").to_vector());
  REQUIRE(io::read_gguf_tensor(g, "blk.1.attn_q.weight") ==
          w.at("model.layers.1.self_attn.q_proj.weight").to_vector());
}

TEST_CASE("cli: export-gguf refuses a GLM-4-MoE llama.cpp's glm4moe cannot hold",
          "[cli][gguf][glm4_moe]") {
  test::ScratchDir dir("cli-gguf-glm4-moe-refused");
  TinyGlm t;
  t.shared = 0;  // llama.cpp's glm4moe graph always adds a shared expert
  std::map<std::string, Tensor> w;
  const std::string ckpt = import_glm(dir, "glm", t, w), out = dir / "glm.gguf";
  auto e = run_command(tool("moe-convert", "export-gguf " + ckpt + " -o " + out));
  REQUIRE(e.exit_code == 1);
  REQUIRE(e.err.find("glm4moe always runs a shared expert") != std::string::npos);
  REQUIRE_FALSE(fs::exists(out));
}

// Every group taking part is no group limit: written as one group, since llama.cpp refuses an
// expert_group_used_count equal to expert_group_count.
TEST_CASE("cli: export-gguf writes all-groups GLM-4-MoE routing as one group",
          "[cli][gguf][glm4_moe]") {
  test::ScratchDir dir("cli-gguf-glm4-moe-groups");
  TinyGlm t;
  t.group_k = t.groups;
  std::map<std::string, Tensor> w;
  const std::string ckpt = import_glm(dir, "glm", t, w), out = dir / "glm.gguf";
  auto e = run_command(tool("moe-convert", "export-gguf " + ckpt + " -o " + out));
  INFO(e.err);
  REQUIRE(e.exit_code == 0);
  const io::GgufFile g = io::read_gguf(out);
  REQUIRE(key_int(g, "glm4moe.expert_group_count") == 1);
  REQUIRE(key_int(g, "glm4moe.expert_group_used_count") == 1);
}
