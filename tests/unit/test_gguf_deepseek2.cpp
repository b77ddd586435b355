// GGUF export of DeepSeek models as llama.cpp's "deepseek2" (issue 44): a tiny DeepSeek-V3 (q
// latent, sigmoid router with its correction bias, 4 groups of which 2 are chosen) and a
// V2-Lite-shaped DeepSeek-V2 (plain q_proj, softmax router), written by
// support/hf_deepseek_v3_model.h, imported, exported as f32 and read back with our reader: every
// key llama.cpp's converter writes for them, and every tensor under llama.cpp's name with its dims
// and values taken from the HF tensors here (f32: exact), the split of kv_b_proj into attn_k_b
// (per head transposed) and attn_v_b written here from the converter's definition. The RoPE rows
// go out in DeepSeek's interleaved layout (llama.cpp's deepseek2 rotates adjacent pairs): checked
// from a directory holding them in halves (rope_interleave false) too. What deepseek2 cannot
// represent is refused by name. (tests/cli/scripts/gguf_deepseek2_readback.sh reads such files
// with llama.cpp's own gguf package.)
// Shape letters: D hidden, H heads, r q_lora_rank, c kv_lora_rank, dn qk_nope, dr qk_rope,
// dv v_head_dim, F expert hidden, Fd dense hidden, E experts.
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "moe/io/gguf.h"
#include "moe/io/gguf_import.h"
#include "support/hf_deepseek_v3_model.h"
#include "support/run.h"

using namespace moe;
using namespace moe::test::hf;

namespace {

std::vector<float> hf_values(const std::map<std::string, Tensor>& w, const std::string& name) {
  return w.at(name).to(DType::f32).to_vector();
}

// Rows of a [R, cols] HF tensor whose rope rows (each head's last dr of hd rows, from `first`)
// are in halves order, permuted to interleaved pairs: file row 2i is HF row i, 2i+1 row dr/2 + i.
std::vector<float> interleaved(const std::vector<float>& w, int64_t heads, int64_t hd,
                               int64_t first, int64_t dr, int64_t cols) {
  std::vector<float> out = w;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < dr / 2; ++i)
      for (int64_t j = 0; j < 2; ++j)
        for (int64_t x = 0; x < cols; ++x)
          out[size_t((h * hd + first + 2 * i + j) * cols + x)] =
              w[size_t((h * hd + first + j * dr / 2 + i) * cols + x)];
  return out;
}

// TinyDeepseek over the byte vocabulary (256 tokens), the one a GGUF without a stored tokenizer
// describes.
TinyDeepseek byte_vocab() {
  TinyDeepseek t;
  t.moe.V = 256;
  return t;
}

int64_t key_int(const io::GgufFile& g, const std::string& key) {
  INFO("key " << key);
  REQUIRE(g.metadata.contains(key));
  return g.metadata[key]["value"].get<int64_t>();
}

// Exports a DeepSeek directory written from `t` and checks every key and tensor of the file.
void check_export(const TinyDeepseek& t, const std::string& dir, uint64_t seed) {
  const auto w = deepseek_weights(t, seed);
  write_hf_dir(dir, t.v2 ? deepseek_v2_config(t) : deepseek_config(t), w, 1);
  const io::Checkpoint ckpt = test::import_hf_held(dir);
  const std::string path = dir + ".gguf";
  const io::GgufExportSummary s = io::export_gguf(ckpt, path, {io::GgufType::f32, "ds"});
  const io::GgufFile g = io::read_gguf(path);
  const TinyGlm& m = t.moe;
  const test::dsv3::MlaShape& a = t.attn;
  const int64_t D = m.D, H = m.H, r = a.r, c = a.c, dn = a.dn, dr = a.dr, dv = a.dv;
  const int64_t hd = dn + dr, F = m.F, E = m.E;
  REQUIRE(g.metadata["general.architecture"]["value"] == "deepseek2");
  const std::map<std::string, int64_t> keys = {
      {"block_count", m.L},
      {"embedding_length", D},
      {"feed_forward_length", m.Fd},  // HF intermediate_size: the dense layers'
      {"expert_feed_forward_length", F},
      {"attention.head_count", H},
      {"attention.head_count_kv", 1},  // the absorbed attention's one latent head
      {"attention.key_length", c + dr},
      {"attention.value_length", c},
      {"attention.key_length_mla", hd},
      {"attention.value_length_mla", dv},
      {"attention.q_lora_rank", r},  // 0: attn_q (V2-Lite)
      {"attention.kv_lora_rank", c},
      {"rope.dimension_count", dr},
      {"expert_count", E},
      {"expert_used_count", m.k},
      {"leading_dense_block_count", m.dense},
      {"expert_shared_count", m.shared},
      {"expert_gating_func", t.v2 ? 1 : 2},  // SOFTMAX / SIGMOID
      {"expert_group_count", t.v2 ? 1 : m.groups},
      {"expert_group_used_count", t.v2 ? 1 : m.group_k}};
  for (const auto& [key, want] : keys) CHECK(key_int(g, "deepseek2." + key) == want);
  CHECK(g.metadata["deepseek2.expert_weights_scale"]["value"].get<float>() == float(m.scale));
  CHECK(g.metadata["deepseek2.expert_weights_norm"]["value"].get<bool>() == (!t.v2 && m.norm_topk));
  CHECK_FALSE(g.metadata.contains("deepseek2.expert_shared_feed_forward_length"));

  size_t checked = 0;
  auto check = [&](const std::string& gguf, const std::vector<float>& want,
                   const std::vector<int64_t>& dims) {
    INFO("tensor " << gguf);
    REQUIRE(g.tensor(gguf).dims == dims);
    REQUIRE(io::read_gguf_tensor(g, gguf) == want);
    ++checked;
  };
  auto same = [&](const std::string& gguf, const std::string& hf_name,
                  const std::vector<int64_t>& dims) { check(gguf, hf_values(w, hf_name), dims); };
  same("token_embd.weight", "model.embed_tokens.weight", {D, m.V});
  same("output.weight", "lm_head.weight", {D, m.V});
  same("output_norm.weight", "model.norm.weight", {D});
  for (int64_t i = 0; i < m.L; ++i) {
    const std::string blk = str("blk.", i, "."), p = str("model.layers.", i, ".");
    const std::string at = p + "self_attn.";
    same(blk + "attn_norm.weight", p + "input_layernorm.weight", {D});
    same(blk + "ffn_norm.weight", p + "post_attention_layernorm.weight", {D});
    // q: each head [nope | rope], the rope rows interleaved as DeepSeek's own files hold them.
    const int64_t q_in = r > 0 ? r : D;
    std::vector<float> q = hf_values(w, at + (r > 0 ? "q_b_proj.weight" : "q_proj.weight"));
    if (!t.interleave) q = interleaved(q, H, hd, dn, dr, q_in);
    check(blk + (r > 0 ? "attn_q_b.weight" : "attn_q.weight"), q, {q_in, H * hd});
    if (r > 0) {
      same(blk + "attn_q_a.weight", at + "q_a_proj.weight", {D, r});
      same(blk + "attn_q_a_norm.weight", at + "q_a_layernorm.weight", {r});
    }
    std::vector<float> kv_a = hf_values(w, at + "kv_a_proj_with_mqa.weight");
    if (!t.interleave) kv_a = interleaved(kv_a, 1, c + dr, c, dr, D);
    check(blk + "attn_kv_a_mqa.weight", kv_a, {D, c + dr});
    same(blk + "attn_kv_a_norm.weight", at + "kv_a_layernorm.weight", {c});
    // kv_b_proj [H (dn + dv), c]: k_b[h][x][j] = kv_b[h (dn + dv) + j][x]; v_b[h][j][x] =
    // kv_b[h (dn + dv) + dn + j][x].
    const std::vector<float> kv_b = hf_values(w, at + "kv_b_proj.weight");
    std::vector<float> k_b(size_t(H * c * dn)), v_b(size_t(H * dv * c));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t x = 0; x < c; ++x) {
        for (int64_t j = 0; j < dn; ++j)
          k_b[size_t((h * c + x) * dn + j)] = kv_b[size_t((h * (dn + dv) + j) * c + x)];
        for (int64_t j = 0; j < dv; ++j)
          v_b[size_t((h * dv + j) * c + x)] = kv_b[size_t((h * (dn + dv) + dn + j) * c + x)];
      }
    check(blk + "attn_k_b.weight", k_b, {dn, c, H});
    check(blk + "attn_v_b.weight", v_b, {c, dv, H});
    same(blk + "attn_output.weight", at + "o_proj.weight", {H * dv, D});
    if (i < m.dense) {
      same(blk + "ffn_gate.weight", p + "mlp.gate_proj.weight", {D, m.Fd});
      same(blk + "ffn_up.weight", p + "mlp.up_proj.weight", {D, m.Fd});
      same(blk + "ffn_down.weight", p + "mlp.down_proj.weight", {m.Fd, D});
      continue;
    }
    same(blk + "ffn_gate_inp.weight", p + "mlp.gate.weight", {D, E});
    if (!t.v2) same(blk + "exp_probs_b.bias", p + "mlp.gate.e_score_correction_bias", {E});
    const std::vector<float> up = io::read_gguf_tensor(g, blk + "ffn_up_exps.weight");
    REQUIRE(g.tensor(blk + "ffn_up_exps.weight").dims == std::vector<int64_t>{D, F, E});
    REQUIRE(g.tensor(blk + "ffn_gate_exps.weight").dims == std::vector<int64_t>{D, F, E});
    REQUIRE(g.tensor(blk + "ffn_down_exps.weight").dims == std::vector<int64_t>{F, D, E});
    REQUIRE(std::vector<float>(up.begin() + 3 * F * D, up.begin() + 4 * F * D) ==
            hf_values(w, p + "mlp.experts.3.up_proj.weight"));
    checked += 3;
    const int64_t Fs = m.shared * F;
    same(blk + "ffn_gate_shexp.weight", p + "mlp.shared_experts.gate_proj.weight", {D, Fs});
    same(blk + "ffn_up_shexp.weight", p + "mlp.shared_experts.up_proj.weight", {D, Fs});
    same(blk + "ffn_down_shexp.weight", p + "mlp.shared_experts.down_proj.weight", {Fs, D});
  }
  REQUIRE(checked == g.tensors.size());  // nothing written that is not checked here
  REQUIRE(s.tensors == static_cast<int64_t>(g.tensors.size()));
}

}  // namespace

TEST_CASE("gguf deepseek2: DeepSeek-V3, every key and tensor", "[gguf][deepseek_v3]") {
  test::ScratchDir dir("gguf-deepseek2-v3");
  TinyDeepseek t = byte_vocab();  // a multi-token-prediction layer: skipped by import
  check_export(t, dir.file("v3"), 21);
  // A directory whose rope rows are in halves (rope_interleave false): the file still holds
  // DeepSeek's interleaved pairs, the rows llama.cpp's NORM rope rotates together.
  t.interleave = false, t.attn.interleaved = false;
  check_export(t, dir.file("v3-halves"), 22);
}

TEST_CASE("gguf deepseek2: V2-Lite-shaped DeepSeek-V2, every key and tensor",
          "[gguf][deepseek_v3]") {
  test::ScratchDir dir("gguf-deepseek2-v2");
  TinyDeepseek t = byte_vocab();
  t.v2 = true, t.nextn = 0, t.attn.r = 0, t.moe.shared = 2, t.moe.scale = 1.0;
  check_export(t, dir.file("v2-lite"), 23);
}

TEST_CASE("gguf deepseek2: what llama.cpp's deepseek2 cannot represent is refused by name",
          "[gguf][deepseek_v3]") {
  test::ScratchDir dir("gguf-deepseek2-refused");
  auto refusal = [&](const TinyDeepseek& t, const json& config) {
    write_hf_dir(dir.file("src"), config, deepseek_weights(t, 24), 1);
    const io::Checkpoint c = test::import_hf_held(dir.file("src"));
    return test::error_of([&] { io::export_gguf(c, dir.file("x.gguf"), {}); });
  };
  TinyDeepseek t = byte_vocab();
  t.nextn = 0;
  t.moe.shared = 0;  // llama.cpp's graph always adds the shared expert
  CHECK_THAT(refusal(t, deepseek_config(t)),
             Catch::Contains("llama.cpp's deepseek2 always runs a shared expert"));
  t = byte_vocab();
  t.nextn = 0;
  // llama.cpp takes mscale = mscale_all_dim: another mscale would rotate and scale otherwise.
  json yarn = deepseek_config(t);
  yarn["rope_parameters"] = {{"rope_theta", 50.0}, {"rope_type", "yarn"},
                             {"factor", 4.0},      {"original_max_position_embeddings", 16},
                             {"mscale", 0.5},      {"mscale_all_dim", 1.0}};
  CHECK_THAT(refusal(t, yarn), Catch::Contains("mscale other than mscale_all_dim"));
  yarn["rope_parameters"].erase("mscale");
  yarn["rope_parameters"].erase("mscale_all_dim");
  CHECK_THAT(refusal(t, yarn), Catch::Contains("no mscale_all_dim"));
  CHECK_FALSE(std::filesystem::exists(dir.file("x.gguf")));
}

TEST_CASE("gguf deepseek2: YaRN's keys, the log multiplier 0.1 mscale_all_dim",
          "[gguf][deepseek_v3][yarn]") {
  test::ScratchDir dir("gguf-deepseek2-yarn");
  TinyDeepseek t = byte_vocab();
  t.nextn = 0, t.attn.dr = 8;
  t.attn.yarn = {40.0, 64.0, 32.0, 1.0, 0.707, 0.707};  // DeepSeek-V2's settings, a small context
  write_hf_dir(dir.file("src"), deepseek_config(t), deepseek_weights(t, 25), 1);
  const io::Checkpoint c = test::import_hf_held(dir.file("src"));
  io::export_gguf(c, dir.file("y.gguf"), {});
  const io::GgufFile g = io::read_gguf(dir.file("y.gguf"));
  const auto& k = g.metadata;
  CHECK(k["deepseek2.rope.scaling.type"]["value"] == "yarn");
  CHECK(k["deepseek2.rope.scaling.factor"]["value"].get<float>() == 40.0f);
  CHECK(key_int(g, "deepseek2.rope.scaling.original_context_length") == 64);
  // llama.cpp divides it by 0.1 again (its TAG_DEEPSEEK2_YARN_LOG_MUL_FIX).
  CHECK(k["deepseek2.rope.scaling.yarn_beta_fast"]["value"].get<float>() == 32.0f);
  CHECK(k["deepseek2.rope.scaling.yarn_beta_slow"]["value"].get<float>() == 1.0f);
  CHECK(k["deepseek2.rope.scaling.yarn_log_multiplier"]["value"].get<float>() ==
        float(0.1 * 0.707));
}

TEST_CASE("gguf deepseek2: export-gguf -> import-gguf gives the same model and scores",
          "[gguf][deepseek_v3]") {
  test::ScratchDir dir("gguf-deepseek2-round-trip");
  for (bool v2 : {false, true}) {
    TinyDeepseek t = byte_vocab();
    t.nextn = 0;
    if (v2) t.v2 = true, t.attn.r = 0, t.moe.shared = 2, t.moe.scale = 1.3;
    for (DType dtype : {DType::f32, DType::bf16}) {
      INFO((v2 ? "V2-Lite" : "V3") << ", " << dtype_name(dtype));
      std::map<std::string, Tensor> w;
      for (const auto& [name, tensor] : deepseek_weights(t, 26))  // the bias stays f32
        w[name] = name.ends_with("e_score_correction_bias") ? tensor : tensor.to(dtype);
      const std::string src = dir.file(str(v2 ? "v2" : "v3", "-", dtype_name(dtype)));
      write_hf_dir(src, v2 ? deepseek_v2_config(t) : deepseek_config(t), w, 1);
      const io::Checkpoint imported = test::import_hf_held(src);
      const io::GgufType type = dtype == DType::f32 ? io::GgufType::f32 : io::GgufType::bf16;
      io::export_gguf(imported, src + ".gguf", {type, "ds"});
      io::GgufImportReport report;
      io::Checkpoint back = io::import_gguf(src + ".gguf", {}, &report);
      io::hold_all(back.params);
      CHECK(report.architecture == "deepseek2");
      REQUIRE(back.model_config == imported.model_config);  // the record agreed with the keys
      // Every parameter bitwise, whatever order each import lists them in.
      REQUIRE(back.params.size() == imported.params.size());
      std::map<std::string, const io::NamedTensor*> by_name;
      for (const io::NamedTensor& p : back.params) by_name[p.name] = &p;
      for (const io::NamedTensor& p : imported.params) {
        INFO("parameter " << p.name);
        REQUIRE(by_name.count(p.name));
        REQUIRE(same_bytes(by_name[p.name]->tensor, p.tensor));
      }
      const auto ids = random_token_ids(2 * 7, int32_t(t.moe.V), 27);
      REQUIRE(our_logits(back, src + "-back.h5", ids, 2, 7) ==
              our_logits(imported, src + "-hf.h5", ids, 2, 7));
    }
  }
}

TEST_CASE("gguf deepseek2: the keys alone give the model the record holds",
          "[gguf][deepseek_v3][yarn]") {
  // import-gguf takes our exporter's record (moe.model_config) only when the model the keys
  // describe computes the same (same latent widths, routing, groups, dense layers, YaRN's
  // mscale_all_dim from the f32 log multiplier, ...); otherwise it notes a disagreement and keeps
  // the keys' reading. So a record taken proves the keys, as llama.cpp reads them, say it all.
  test::ScratchDir dir("gguf-deepseek2-keys");
  TinyDeepseek t = byte_vocab();
  t.nextn = 0, t.attn.dr = 8;
  t.attn.yarn = {40.0, 64.0, 32.0, 1.0, 1.0, 1.0};  // DeepSeek-V3's settings, a small context
  write_hf_dir(dir.file("src"), deepseek_config(t), deepseek_weights(t, 28), 1);
  const io::Checkpoint imported = test::import_hf_held(dir.file("src"));
  io::export_gguf(imported, dir.file("a.gguf"), {});
  io::GgufImportReport report;
  const io::Checkpoint back = io::import_gguf(dir.file("a.gguf"), {}, &report);
  std::string notes;
  for (const std::string& note : report.notes) notes += note + "\n";
  INFO(notes);
  CHECK(notes.find("model config taken from the exporter's record") != std::string::npos);
  REQUIRE(back.model_config == imported.model_config);
}
