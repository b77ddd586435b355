// GGUF export of gpt_oss models as llama.cpp's "gpt-oss" (issue 44): a tiny gpt_oss model (GQA
// with a head width other than D / H, windows on the even layers, YaRN with truncate false, every
// parameter drawn at random so that no bias or sink is zero) exported as f32 and read back with
// our reader: every key llama.cpp's converter writes for gpt-oss with its value, no key its graph
// fixes (expert_gating_func, sliding_window_pattern), and every tensor under llama.cpp's name with
// its dims, type and values (f32: the checkpoint's exactly). What llama.cpp's gpt-oss graph
// hard-codes (alpha 1.702, limit 7, the window on the even layers, an untied head) is refused by
// name. (tests/cli/scripts/gguf_gpt_oss_readback.sh reads such files with llama.cpp's own gguf
// package.) Then import-gguf of such files: f32 and bf16 bitwise, the keys alone giving the
// model (the even layers sliding, YaRN truncated as llama.cpp runs it), MXFP4 blocks kept.
// Shape letters: V vocabulary, D hidden, H heads, KV kv heads, hd head dim, F expert hidden,
// E experts.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "io/gguf_import_gpt_oss.h"
#include "moe/error.h"
#include "moe/io/gguf.h"
#include "moe/io/gguf_import.h"
#include "moe/io/tokenizer.h"
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
  // truncate false goes out with a note: llama.cpp always floors / ceils YaRN's range. Every
  // tensor is in the asked type (f32): no fallback.
  REQUIRE(s.notes.size() == 1);
  REQUIRE_THAT(s.notes[0], Catch::Contains("truncate false"));
  REQUIRE(s.fallbacks.empty());
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

TEST_CASE("gguf gpt-oss: no window goes out as one as long as the context, YaRN truncated no note",
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
  REQUIRE(s.notes.empty());
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

// ---- import-gguf (llama.cpp's gpt-oss back to our gpt_oss) -------------------------------------

namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Every param of `want` in `got` (whatever the order) with the same dtype, shape and bytes.
void require_same_params(io::Checkpoint got, const io::Checkpoint& want) {
  io::hold_all(got.params);
  REQUIRE(got.params.size() == want.params.size());
  for (const io::NamedTensor& p : want.params) {
    INFO("parameter " << p.name);
    REQUIRE(same_bytes(param(got, p.name).tensor, p.tensor));
  }
}

std::string notes_of(const io::GgufImportReport& r) {
  std::string notes;
  for (const std::string& n : r.notes) notes += n + "\n";
  return notes;
}

}  // namespace

TEST_CASE("gguf gpt-oss import: f32 and bf16 exports come back bitwise, the keys saying it all",
          "[gguf][gpt_oss]") {
  test::ScratchDir dir("gguf-gpt-oss-import");
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dtype));
    // YaRN truncated: the model llama.cpp runs, so the exporter's record agrees with the keys.
    ModelConfig c = tiny_gpt_oss();
    c.yarn.truncate = true;
    c.dtype = dtype;
    const io::Checkpoint ckpt = random_checkpoint(c, 61);
    const std::string a = dir.file(str("a-", dtype_name(dtype), ".gguf"));
    const io::GgufType type = dtype == DType::f32 ? io::GgufType::f32 : io::GgufType::bf16;
    io::export_gguf(ckpt, a, {type, "oss"});
    io::GgufImportReport report;
    io::Checkpoint back = io::import_gguf(a, {}, &report);
    io::hold_all(back.params);
    INFO(notes_of(report));
    REQUIRE(report.architecture == "gpt-oss");
    REQUIRE(report.family == "gpt_oss");
    REQUIRE_THAT(notes_of(report), Catch::Contains("taken from the exporter's record"));
    REQUIRE(back.model_config == ckpt.model_config);
    require_same_params(back, ckpt);  // the sinks f32 in a bf16 model too
    // ... and exported again, the same file byte for byte.
    const std::string b = dir.file(str("b-", dtype_name(dtype), ".gguf"));
    io::export_gguf(back, b, {type, "oss"});
    REQUIRE(test::read_file(a) == test::read_file(b));
  }
}

TEST_CASE("gguf gpt-oss import: the window on the even layers, YaRN truncated as llama.cpp runs it",
          "[gguf][gpt_oss][yarn]") {
  test::ScratchDir dir("gguf-gpt-oss-import-keys");
  const io::Checkpoint ckpt = random_checkpoint(tiny_gpt_oss(), 62);  // YaRN truncate false
  io::export_gguf(ckpt, dir.file("a.gguf"), {io::GgufType::f32, "oss"});
  io::GgufImportReport report;
  const io::Checkpoint back = io::import_gguf(dir.file("a.gguf"), {}, &report);
  // llama.cpp floors / ceils the correction range whatever the model says: the keys' model
  // differs from the record's, which is noted and left.
  REQUIRE_THAT(notes_of(report), Catch::Contains("disagrees with the file's keys"));
  const ModelConfig mc = model_config_from_json(back.model_config);
  CHECK(mc.arch == Arch::gpt_oss);
  CHECK(mc.sliding_window == 4);
  CHECK(mc.window_layers == std::vector<int64_t>{0, 2});
  CHECK(mc.rope_type == RopeType::yarn);
  CHECK(mc.yarn.truncate);
  CHECK(mc.yarn.factor == 4);
  CHECK(mc.yarn.original_ctx == 8);
  CHECK(mc.normalize_topk);
  CHECK(mc.swiglu_alpha == 1.702);
  CHECK(mc.swiglu_limit == 7.0);
  CHECK(mc.head_dim_resolved() == 32);
  CHECK(mc.kv_heads_resolved() == 2);
  require_same_params(back, ckpt);
}

TEST_CASE("gguf gpt-oss import: MXFP4 weight matrices keep the file's blocks", "[gguf][gpt_oss]") {
  test::ScratchDir dir("gguf-gpt-oss-import-mxfp4");
  ModelConfig c = tiny_gpt_oss();
  c.yarn.truncate = true;
  const io::Checkpoint ckpt = random_checkpoint(c, 63);
  const std::string path = dir.file("m.gguf");
  io::export_gguf(ckpt, path, {io::GgufType::mxfp4, "oss"});
  io::GgufImportReport report;
  io::Checkpoint back = io::import_gguf(path, {}, &report);
  io::hold_all(back.params);
  REQUIRE(report.recipe == "mxfp4");
  const io::GgufFile g = io::read_gguf(path);
  for (const char* name : {"w1", "w2", "w3"}) {
    INFO(name);
    const io::NamedTensor& w = param(back, str("blocks.1.moe.experts.", name));
    REQUIRE(w.tensor.dtype() == DType::u8);
    const char* file = name[1] == '1' ? "gate" : name[1] == '2' ? "down" : "up";
    const std::string gguf = str("blk.1.ffn_", file, "_exps.weight");
    const std::vector<uint8_t> bytes = io::read_gguf_tensor_bytes(g, gguf);
    REQUIRE(bytes.size() == w.tensor.nbytes());
    REQUIRE(std::memcmp(bytes.data(), w.tensor.raw(), bytes.size()) == 0);
  }
  // The biases, sinks and router stay floats, the checkpoint's values exactly.
  for (const char* name : {"attn.sinks", "attn.o.bias", "moe.router.logit_bias", "moe.experts.b2"})
    REQUIRE(same_bytes(param(back, str("blocks.2.", name)).tensor,
                       param(ckpt, str("blocks.2.", name)).tensor));
  // Exported again (as f32), the kept blocks go out as they are, in MXFP4: every tensor but the
  // embedding (which the import dequantised, as llama.cpp's row lookup does) byte for byte.
  const std::string again = dir.file("again.gguf");
  io::export_gguf(back, again, {io::GgufType::f32, "oss"});
  const io::GgufFile h = io::read_gguf(again);
  REQUIRE(key(h, "general.file_type").get<int64_t>() == 38);  // llama.cpp's MOSTLY_MXFP4_MOE
  REQUIRE(h.tensors.size() == g.tensors.size());
  int64_t blocks = 0;
  for (const io::GgufTensorInfo& t : g.tensors) {
    INFO(t.name);
    if (t.name == "token_embd.weight") continue;
    REQUIRE(h.tensor(t.name).type == t.type);
    REQUIRE(h.tensor(t.name).dims == t.dims);
    REQUIRE(io::read_gguf_tensor_bytes(h, t.name) == io::read_gguf_tensor_bytes(g, t.name));
    blocks += t.type == io::GgufType::mxfp4;
  }
  REQUIRE(blocks == 3 * 7 + 1);  // q, k, v, o and the three experts' of each layer, the head
}

TEST_CASE("gguf gpt-oss import: keys llama.cpp's converter never writes are read or refused",
          "[gguf][gpt_oss]") {
  // The keys alone (io/gguf_import_gpt_oss.h): llama.cpp's default pattern (u32 2: the even
  // layers slide) is taken, another refused naming the key; a window as long as the context is
  // none.
  io::GgufFile f;
  f.path = "m.gguf";
  auto u32 = [](int64_t v) { return nlohmann::ordered_json{{"type", 4}, {"value", v}}; };
  f.metadata["gpt-oss.attention.sliding_window"] = u32(8);
  ModelConfig mc = tiny_gpt_oss();
  mc.window_layers.clear();
  const io::gguf::Keys k(f);
  io::gguf::gpt_oss_config(k, mc);
  CHECK(mc.sliding_window == 8);
  CHECK(mc.window_layers == std::vector<int64_t>{0, 2});
  f.metadata["gpt-oss.attention.sliding_window_pattern"] = u32(2);
  io::gguf::gpt_oss_config(k, mc);
  CHECK(mc.window_layers == std::vector<int64_t>{0, 2});
  f.metadata["gpt-oss.attention.sliding_window_pattern"] = u32(3);
  REQUIRE_THROWS_WITH(io::gguf::gpt_oss_config(k, mc),
                      Catch::Contains("'m.gguf': GGUF key "
                                      "'gpt-oss.attention.sliding_window_pattern'") &&
                          Catch::Contains("not supported"));
  f.metadata.erase("gpt-oss.attention.sliding_window_pattern");
  f.metadata["gpt-oss.attention.sliding_window"] = u32(32);  // = seq
  io::gguf::gpt_oss_config(k, mc);
  CHECK(mc.sliding_window == 0);
  CHECK(mc.window_layers.empty());
}

TEST_CASE("gguf gpt-oss: o200k's pre-tokenizer goes out as llama.cpp's gpt-4o and comes back",
          "[gguf][gpt_oss][tokenizer]") {
  // gpt-oss's tokenizer.json splits with o200k's expression then byte-level without a regex, no
  // normaliser: tests/data's byte-level BPE (700 tokens) given that pre-tokenizer.
  test::ScratchDir dir("gguf-gpt-oss-o200k");
  const std::string qwen =
      test::read_file(std::string(MOE_TEST_DATA_DIR) + "/tokenizers/bpe-qwen/tokenizer.json");
  nlohmann::json j = nlohmann::json::parse(qwen);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
      "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";  // tiktoken's o200k_base
  const std::string o200k = j.dump();
  const auto tok = io::tokenizer_from_bytes("tokenizer.json", o200k, "o200k");
  REQUIRE(tok->llama_pre_tokenizer() == "gpt-4o");
  const std::string text = "Prices: 12345 coins, HelloWorld's 7 cats\n";

  ModelConfig c = tiny_gpt_oss();
  c.vocab_size = 704;  // room for the 700 tokens and 3 added ones
  io::Checkpoint ckpt = random_checkpoint(c, 65);
  ckpt.tokenizer = {"tokenizer.json", o200k};
  const std::string path = dir.file("t.gguf");
  io::export_gguf(ckpt, path, {io::GgufType::f32, "oss"});
  const io::GgufFile g = io::read_gguf(path);
  REQUIRE(key(g, "tokenizer.ggml.model") == "gpt2");
  REQUIRE(key(g, "tokenizer.ggml.pre") == "gpt-4o");
  io::GgufImportReport report;
  const io::Checkpoint back = io::import_gguf(path, {}, &report);
  INFO(notes_of(report));
  REQUIRE_FALSE(back.tokenizer.empty());
  // Rebuilt as gpt-oss's tokenizer.json has it: o200k's Split, byte-level without a regex, no
  // normaliser (recognised as gpt-4o again only with the expression's exact text).
  const nlohmann::json rebuilt = nlohmann::json::parse(back.tokenizer.bytes);
  CHECK(rebuilt["normalizer"].is_null());
  CHECK(rebuilt["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] ==
        j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]);
  CHECK(rebuilt["pre_tokenizer"]["pretokenizers"][1]["use_regex"] == false);
  const auto again = io::tokenizer_from_bytes(back.tokenizer.file, back.tokenizer.bytes, "back");
  REQUIRE(again->llama_pre_tokenizer() == "gpt-4o");
  for (const std::string& t : {text, std::string("DON'T stop: x/y/z 2024-12-07\r\n\r\n  end")})
    REQUIRE(again->encode(t) == tok->encode(t));
}
