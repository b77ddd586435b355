// GGUF export of gpt_oss models as llama.cpp's "gpt-oss" (issue 44): a tiny gpt_oss model (GQA
// with a head width other than D / H, windows on the even layers, YaRN with truncate false, every
// parameter drawn at random so that no bias or sink is zero) exported as f32 and read back with
// our reader: every key llama.cpp's converter writes for gpt-oss with its value, no key its graph
// fixes (expert_gating_func, sliding_window_pattern), and every tensor under llama.cpp's name with
// its dims, type and values (f32: the checkpoint's exactly). What llama.cpp's gpt-oss graph
// hard-codes (alpha 1.702, limit 7, the window on the even layers, an untied head) is refused by
// name. (tests/cli/scripts/gguf_gpt_oss_readback.sh reads such files with llama.cpp's own gguf
// package.)
// Shape letters: V vocabulary, D hidden, H heads, KV kv heads, hd head dim, F expert hidden,
// E experts.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "moe/error.h"
#include "moe/io/gguf.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;

namespace {

// 3 layers (the even ones 0 and 2 slide over 4 positions), D 64, H 4 of hd 32 (H hd != D), KV 2,
// E 4 top-2, F 32 (every row whole MXFP4 blocks), YaRN factor 4 over 8 positions with truncate
// false (gpt-oss's own setting).
ModelConfig tiny_gpt_oss() {
  ModelConfig c;
  c.arch = Arch::gpt_oss;
  c.vocab_size = 256;
  c.layers = 3;
  c.d_model = 64;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 32;
  c.d_ff = 32;
  c.seq = 32;
  c.experts = 4;
  c.moe_every = 1;
  c.top_k = 2;
  c.normalize_topk = true;
  c.rope_theta = 150000;
  c.sliding_window = 4;
  c.window_layers = {0, 2};
  c.rope_type = RopeType::yarn;
  c.yarn.factor = 4;
  c.yarn.original_ctx = 8;
  c.yarn.truncate = false;
  return c;
}

// A freshly initialised checkpoint of `c` with every parameter redrawn (normal, seeded): the
// biases, sinks and router bias start at zero, which would hide a swapped tensor.
io::Checkpoint random_checkpoint(ModelConfig c, uint64_t seed) {
  c.resolve();
  io::Checkpoint ckpt = test::initial_checkpoint(c, seed, c.dtype);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (io::NamedTensor& nt : ckpt.params) {
    std::vector<float> v(static_cast<size_t>(nt.tensor.numel()));
    for (float& x : v) x = normal(rng);
    nt.tensor = Tensor::from_vector(nt.tensor.shape(), v).to(nt.tensor.dtype());
  }
  return ckpt;
}

const io::NamedTensor& param(const io::Checkpoint& c, const std::string& name) {
  for (const io::NamedTensor& nt : c.params)
    if (nt.name == name) return nt;
  FAIL("no param " << name);
  throw Error("unreachable");
}

nlohmann::ordered_json key(const io::GgufFile& g, const std::string& k) {
  INFO("key " << k);
  REQUIRE(g.metadata.contains(k));
  return g.metadata[k]["value"];
}

std::string export_error(const io::Checkpoint& ckpt, const std::string& path) {
  try {
    io::export_gguf(ckpt, path, {io::GgufType::f32, "oss"});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("gguf gpt-oss: every key and tensor of llama.cpp's gpt-oss", "[gguf][gpt_oss]") {
  test::ScratchDir dir("gguf-gpt-oss");
  const ModelConfig c = tiny_gpt_oss();
  const io::Checkpoint ckpt = random_checkpoint(c, 51);
  const std::string path = dir / "oss.gguf";
  const io::GgufExportSummary s = io::export_gguf(ckpt, path, {io::GgufType::f32, "oss"});
  // truncate false goes out with a note: llama.cpp always floors / ceils YaRN's range.
  REQUIRE(s.fallbacks.size() == 1);
  REQUIRE_THAT(s.fallbacks[0], Catch::Contains("truncate false"));
  const io::GgufFile g = io::read_gguf(path);
  const int64_t V = 256, D = 64, H = 4, KV = 2, hd = 32, F = 32, E = 4;
  REQUIRE(key(g, "general.architecture") == "gpt-oss");
  const std::map<std::string, int64_t> ints = {{"vocab_size", V},
                                               {"context_length", 32},
                                               {"embedding_length", D},
                                               {"block_count", 3},
                                               {"feed_forward_length", F},
                                               {"expert_feed_forward_length", F},
                                               {"attention.head_count", H},
                                               {"attention.head_count_kv", KV},
                                               {"attention.key_length", hd},
                                               {"attention.value_length", hd},
                                               {"rope.dimension_count", hd},
                                               {"expert_count", E},
                                               {"expert_used_count", 2},
                                               {"attention.sliding_window", 4},
                                               {"rope.scaling.original_context_length", 8}};
  for (const auto& [k, v] : ints) {
    INFO(k);
    REQUIRE(key(g, "gpt-oss." + k).get<int64_t>() == v);
  }
  const std::map<std::string, double> reals = {{"rope.freq_base", 150000},
                                               {"attention.layer_norm_rms_epsilon", 1e-5},
                                               {"rope.scaling.factor", 4},
                                               {"rope.scaling.yarn_beta_fast", 32},
                                               {"rope.scaling.yarn_beta_slow", 1}};
  for (const auto& [k, v] : reals) {
    INFO(k);
    REQUIRE(key(g, "gpt-oss." + k).get<float>() == static_cast<float>(v));
  }
  REQUIRE(key(g, "gpt-oss.rope.scaling.type") == "yarn");
  // What llama.cpp's gpt-oss graph fixes has no key (softmax over the top-k; even layers slide).
  REQUIRE_FALSE(g.metadata.contains("gpt-oss.expert_gating_func"));
  REQUIRE_FALSE(g.metadata.contains("gpt-oss.attention.sliding_window_pattern"));
  REQUIRE_FALSE(g.metadata.contains("gpt-oss.expert_weights_norm"));

  // name -> (our param, dims fastest first, f32 as the checkpoint holds it)
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> want = {
      {"token_embd.weight", {"embed.tokens", {D, V}}},
      {"output.weight", {"lm_head.weight", {D, V}}},
      {"output_norm.weight", {"final_norm.weight", {D}}}};
  for (int64_t i = 0; i < 3; ++i) {
    const std::string b = str("blocks.", i, "."), blk = str("blk.", i, ".");
    auto put = [&](const std::string& gguf, const std::string& ours, std::vector<int64_t> dims) {
      want[blk + gguf] = {b + ours, std::move(dims)};
    };
    put("attn_norm.weight", "norm1.weight", {D});
    put("post_attention_norm.weight", "norm2.weight", {D});
    put("attn_q.weight", "attn.q.weight", {D, H * hd});  // NEOX rope: rows as they are
    put("attn_q.bias", "attn.q.bias", {H * hd});
    put("attn_k.weight", "attn.k.weight", {D, KV * hd});
    put("attn_k.bias", "attn.k.bias", {KV * hd});
    put("attn_v.weight", "attn.v.weight", {D, KV * hd});
    put("attn_v.bias", "attn.v.bias", {KV * hd});
    put("attn_output.weight", "attn.o.weight", {H * hd, D});
    put("attn_output.bias", "attn.o.bias", {D});
    put("attn_sinks.weight", "attn.sinks", {H});
    put("ffn_gate_inp.weight", "moe.router.weight", {D, E});
    put("ffn_gate_inp.bias", "moe.router.logit_bias", {E});
    put("ffn_gate_exps.weight", "moe.experts.w1", {D, F, E});
    put("ffn_gate_exps.bias", "moe.experts.b1", {F, E});
    put("ffn_up_exps.weight", "moe.experts.w3", {D, F, E});
    put("ffn_up_exps.bias", "moe.experts.b3", {F, E});
    put("ffn_down_exps.weight", "moe.experts.w2", {F, D, E});
    put("ffn_down_exps.bias", "moe.experts.b2", {D, E});
  }
  REQUIRE(g.tensors.size() == want.size());
  REQUIRE(ckpt.params.size() == want.size());  // every param in one tensor
  for (const io::GgufTensorInfo& t : g.tensors) {
    INFO(t.name);
    REQUIRE(want.count(t.name));
    const auto& [ours, dims] = want.at(t.name);
    REQUIRE(t.dims == dims);
    REQUIRE(t.type == io::GgufType::f32);
    const std::vector<float> values = io::read_gguf_tensor(g, t.name);
    REQUIRE(values == param(ckpt, ours).tensor.to(DType::f32).to_vector());
  }
}

TEST_CASE("gguf gpt-oss: no window goes out as one as long as the context; YaRN truncated no note",
          "[gguf][gpt_oss]") {
  test::ScratchDir dir("gguf-gpt-oss-plain");
  ModelConfig c = tiny_gpt_oss();
  c.sliding_window = 0;
  c.window_layers.clear();
  c.yarn.truncate = true;
  const std::string path = dir / "oss.gguf";
  const io::GgufExportSummary s =
      io::export_gguf(random_checkpoint(c, 52), path, {io::GgufType::f32, "oss"});
  REQUIRE(s.fallbacks.empty());
  const io::GgufFile g = io::read_gguf(path);
  REQUIRE(key(g, "gpt-oss.attention.sliding_window").get<int64_t>() == 32);
}

TEST_CASE("gguf gpt-oss: what llama.cpp's gpt-oss graph fixes is refused by name",
          "[gguf][gpt_oss]") {
  test::ScratchDir dir("gguf-gpt-oss-refused");
  const std::string path = dir / "refused.gguf";
  struct Case {
    const char* what;
    void (*change)(ModelConfig&);
    const char* message;
  };
  const Case cases[] = {
      {"alpha", [](ModelConfig& c) { c.swiglu_alpha = 1.5; }, "swiglu_alpha 1.5"},
      {"limit", [](ModelConfig& c) { c.swiglu_limit = 5; }, "swiglu_limit 5"},
      {"every layer slides", [](ModelConfig& c) { c.window_layers.clear(); },
       "window of 4 is on layers 0, 1, 2"},
      {"odd layers slide", [](ModelConfig& c) { c.window_layers = {1}; },
       "window of 4 is on layers 1"},
      {"tied head", [](ModelConfig& c) { c.tie_embeddings = true; }, "tie_embeddings"},
      {"mscale", [](ModelConfig& c) { c.yarn.mscale = 1; }, "mscale / mscale_all_dim"},
  };
  for (const Case& k : cases) {
    INFO(k.what);
    ModelConfig c = tiny_gpt_oss();
    k.change(c);
    const std::string e = export_error(random_checkpoint(c, 53), path);
    REQUIRE_THAT(e, Catch::Contains("llama.cpp's gpt-oss"));
    REQUIRE_THAT(e, Catch::Contains(k.message));
    REQUIRE_FALSE(std::filesystem::exists(path));
  }
  // A window as long as the context slides nothing: any layers may carry it.
  ModelConfig c = tiny_gpt_oss();
  c.sliding_window = 32;
  c.window_layers.clear();
  REQUIRE(export_error(random_checkpoint(c, 54), path).empty());
}
