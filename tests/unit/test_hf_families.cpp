// Qwen2-MoE, Qwen3-MoE and OLMoE in Hugging Face form (issue 21). The tiny writers and the
// double-precision family reference live in support/hf_families.h; here:
//   - each writer creates every tensor the family's transformers classes create, at their shapes;
//   - the reference's family features each change the logits (the comparisons below can fail);
//   - import-hf sets the family's arch, head_dim, shared expert width and norm_topk_prob, and maps
//     every tensor bitwise under our names; what we cannot express stays refused by name;
//   - export-hf writes the family back (its config keys and names): import -> export -> import
//     is tensor-identical, f32 and bf16, single file and sharded.
// Shape letters: V vocabulary, D hidden, H heads, KV kv heads, hd head dim, F expert hidden,
// Fs shared expert hidden, E experts, L layers, B batch, T sequence.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"
#include "moe/io/hf_checkpoint.h"
#include "moe/io/safetensors.h"
#include "support/hf_families.h"
#include "support/run.h"

using namespace moe;
using namespace moe::test::hf;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::vector<std::string> kFamilies = {"qwen2_moe", "qwen3_moe", "olmoe"};

// The per-layer tensors each family's decoder layer creates, beyond Mixtral's (under mlp.*).
size_t extra_per_layer(const std::string& family) {
  return family == "qwen2_moe" ? 3 + 3 + 1 : 2;  // biases, shared expert, its gate | q/k norm
}

std::map<std::string, Tensor> without(std::map<std::string, Tensor> w, const std::string& part) {
  for (auto it = w.begin(); it != w.end();)
    it = it->first.find(part) != std::string::npos ? w.erase(it) : std::next(it);
  return w;
}

}  // namespace

TEST_CASE("hf families: the writers create every tensor of the transformers classes", "[hf]") {
  for (const std::string& family : kFamilies) {
    INFO("family " << family);
    const Tiny t = tiny_of(family);
    const auto w = family_weights(t, 1);
    // Mixtral's tensors (embedding, final norm, head; per layer 2 norms, q/k/v/o, router and 3
    // per expert) plus the family's own.
    REQUIRE(w.size() == size_t(3 + t.L * (7 + 3 * t.E) + t.L * extra_per_layer(family)));
    const std::string p = "model.layers.1.";
    REQUIRE(w.count(p + "mlp.gate.weight"));
    REQUIRE(w.at(p + "self_attn.q_proj.weight").shape() == Shape{t.H * t.hd(), t.D});
    REQUIRE(w.at(p + "self_attn.o_proj.weight").shape() == Shape{t.D, t.H * t.hd()});
    const json c = family_config(t);
    REQUIRE(c["model_type"] == family);
    if (family == "qwen2_moe") {
      REQUIRE(w.at(p + "self_attn.k_proj.bias").shape() == Shape{t.KV * t.hd()});
      REQUIRE_FALSE(w.count(p + "self_attn.o_proj.bias"));
      REQUIRE(w.at(p + "mlp.shared_expert.down_proj.weight").shape() == Shape{t.D, t.shared_F});
      REQUIRE(w.at(p + "mlp.shared_expert_gate.weight").shape() == Shape{1, t.D});
      REQUIRE(c["shared_expert_intermediate_size"] == t.shared_F);
      REQUIRE(c["moe_intermediate_size"] == t.F);
    } else if (family == "qwen3_moe") {
      REQUIRE(t.hd() * t.H != t.D);  // head_dim is not hidden / heads: the import must read it
      REQUIRE(w.at(p + "self_attn.q_norm.weight").shape() == Shape{t.hd()});
      REQUIRE(w.at(p + "self_attn.k_norm.weight").shape() == Shape{t.hd()});
      REQUIRE(c["head_dim"] == t.hd());
    } else {
      REQUIRE(w.at(p + "self_attn.q_norm.weight").shape() == Shape{t.H * t.hd()});
      REQUIRE(w.at(p + "self_attn.k_norm.weight").shape() == Shape{t.KV * t.hd()});
      REQUIRE(c["intermediate_size"] == t.F);
      REQUIRE(c["clip_qkv"].is_null());
    }
  }
}

TEST_CASE("hf families: each feature of the reference changes the logits", "[hf]") {
  const int64_t B = 1, T = 9;
  for (const std::string& family : kFamilies) {
    INFO("family " << family);
    const Tiny t = tiny_of(family);
    const auto w = family_weights(t, 2);
    const auto ids = random_token_ids(B * T, int32_t(t.V), 3);
    const Vec full = hf_reference_logits(t, w, ids, B, T, t.norm_topk);
    // The renormalisation of the top-k gates matters.
    REQUIRE(relative_gap(hf_reference_logits(t, w, ids, B, T, !t.norm_topk), full) > 1e-3);
    // So does each family tensor: dropping it changes the model.
    const std::vector<std::string> features =
        family == "qwen2_moe" ? std::vector<std::string>{"_proj.bias", "shared_expert."}
                              : std::vector<std::string>{"q_norm", "k_norm"};
    for (const std::string& feature : features) {
      INFO("without " << feature);
      REQUIRE(relative_gap(hf_reference_logits(t, without(w, feature), ids, B, T, t.norm_topk),
                           full) > 1e-3);
    }
    if (family == "qwen2_moe") {
      // A 0-wide shared expert (its tensors empty, its gate still there) adds nothing.
      Tiny narrow = t;
      narrow.shared_F = 0;
      const auto w0 = family_weights(narrow, 2);
      REQUIRE(w0.at("model.layers.0.mlp.shared_expert.gate_proj.weight").numel() == 0);
      REQUIRE(relative_gap(hf_reference_logits(narrow, w0, ids, B, T, t.norm_topk),
                           hf_reference_logits(narrow, without(w0, "shared_expert"), ids, B, T,
                                               t.norm_topk)) == 0);
    }
  }
}

TEST_CASE("hf families: import-hf maps every tensor and the family's config", "[hf]") {
  test::ScratchDir dir("hf-families-import");
  for (const std::string& family : kFamilies) {
    INFO("family " << family);
    const Tiny t = tiny_of(family);
    const auto w = family_weights(t, 4);
    write_hf_dir(dir.file(family), family_config(t), w, family == "olmoe" ? 1 : 3);
    io::HfImportReport report;
    const io::Checkpoint ckpt = test::import_hf_held(dir.file(family), {}, &report);
    REQUIRE(report.family == family);
    REQUIRE(report.mapped.size() == w.size());  // every source tensor accounted for
    REQUIRE(report.unmapped.empty());
    REQUIRE(report.unsupported.empty());
    const ModelConfig mc = model_config_from_json(ckpt.model_config);
    REQUIRE(arch_name(mc.arch) == family);
    REQUIRE(mc.head_dim_resolved() == t.hd());
    REQUIRE(mc.shared_expert_ff == t.shared_F);
    REQUIRE(mc.normalize_topk == t.norm_topk);
    REQUIRE(mc.d_ff == t.F);
    REQUIRE(mc.kv_heads_resolved() == t.KV);
    // embed, norm, head; per block 2 norms, q/k/v/o, router, 3 expert tensors, and the family's.
    REQUIRE(ckpt.params.size() == size_t(3 + t.L * (10 + extra_per_layer(family))));
    const std::string p = "model.layers.1.", ours = "blocks.1.";
    REQUIRE(same_bytes(param(ckpt, ours + "attn.q.weight").tensor,
                       w.at(p + "self_attn.q_proj.weight")));
    REQUIRE(same_bytes(param(ckpt, ours + "attn.o.weight").tensor,
                       w.at(p + "self_attn.o_proj.weight")));
    REQUIRE(same_bytes(param(ckpt, ours + "moe.experts.w2").tensor.rows(3, 4).reshape({t.D, t.F}),
                       w.at(p + "mlp.experts.3.down_proj.weight")));
    if (family == "qwen2_moe") {
      for (const char* x : {"q", "k", "v"})
        REQUIRE(same_bytes(param(ckpt, ours + "attn." + x + ".bias").tensor,
                           w.at(p + "self_attn." + x + "_proj.bias")));
      REQUIRE(same_bytes(param(ckpt, ours + "moe.shared.w1").tensor,
                         w.at(p + "mlp.shared_expert.gate_proj.weight")));
      REQUIRE(same_bytes(param(ckpt, ours + "moe.shared.w2").tensor,
                         w.at(p + "mlp.shared_expert.down_proj.weight")));
      REQUIRE(same_bytes(param(ckpt, ours + "moe.shared.w3").tensor,
                         w.at(p + "mlp.shared_expert.up_proj.weight")));
      REQUIRE(same_bytes(param(ckpt, ours + "moe.shared_gate.weight").tensor,
                         w.at(p + "mlp.shared_expert_gate.weight")));
      REQUIRE_FALSE(param(ckpt, ours + "moe.shared.w1").expert);
    } else {
      REQUIRE(same_bytes(param(ckpt, ours + "attn.q_norm.weight").tensor,
                         w.at(p + "self_attn.q_norm.weight")));
      REQUIRE(same_bytes(param(ckpt, ours + "attn.k_norm.weight").tensor,
                         w.at(p + "self_attn.k_norm.weight")));
    }
  }

  // Qwen2-MoE with a 0-wide shared expert: its empty tensors and gate are checked and left out.
  Tiny narrow = tiny_of("qwen2_moe");
  narrow.shared_F = 0;
  write_hf_dir(dir.file("narrow"), family_config(narrow), family_weights(narrow, 5), 1);
  io::HfImportReport report;
  const io::Checkpoint ckpt = test::import_hf_held(dir.file("narrow"), {}, &report);
  REQUIRE(model_config_from_json(ckpt.model_config).shared_expert_ff == 0);
  for (const io::NamedTensor& p : ckpt.params) REQUIRE(p.name.find("shared") == std::string::npos);
  REQUIRE(report.mapped.size() == family_weights(narrow, 5).size());
}

TEST_CASE("hf families: what our families cannot express is refused by name", "[hf]") {
  test::ScratchDir dir("hf-families-refused");
  auto refusal = [&](const std::string& name, const json& config,
                     const std::map<std::string, Tensor>& w) {
    write_hf_dir(dir.file(name), config, w, 1);
    return test::error_of([&] { test::import_hf_held(dir.file(name)); });
  };
  const Tiny q3 = tiny_of("qwen3_moe"), q2 = tiny_of("qwen2_moe"), ol = tiny_of("olmoe");
  // One config key changed from what the family's writer gives: the refusal names the feature.
  const struct {
    const Tiny& t;
    json changes;
    std::string message;
  } configs[] = {
      {q3, {{"mlp_only_layers", {1}}}, "dense MLP layers (decoder_sparse_step / mlp_only_layers)"},
      {q2, {{"decoder_sparse_step", 2}}, "dense MLP layers"},
      {q2,
       {{"layer_types", {"sliding_attention", "full_attention"}}},
       "layer_types sliding 1 layers with use_sliding_window false"},
      {ol, {{"clip_qkv", 8.0}}, "q/k/v clipping (clip_qkv)"},
      {ol, {{"attention_bias", true}}, "attention biases (attention_bias: true)"},
      {ol, {{"head_dim", 16}}, "head_dim 16 different from hidden_size / num_attention_heads"},
  };
  int n = 0;
  for (const auto& k : configs) {
    INFO(k.t.family << " with " << k.changes.dump());
    json c = family_config(k.t);
    c.update(k.changes);
    REQUIRE_THAT(refusal("config-" + std::to_string(++n), c, family_weights(k.t, 6)),
                 Catch::Contains(k.message));
  }
  json mla = family_config(q3);
  mla["model_type"] = "dbrx";  // a family we do not have (deepseek_v2 imports now)
  REQUIRE_THAT(refusal("mla", mla, family_weights(q3, 6)),
               Catch::Contains("model_type 'dbrx' is not supported"));
  // A family tensor that is missing or of the wrong shape is named.
  auto w = family_weights(q2, 6);
  w.erase("model.layers.1.self_attn.v_proj.bias");
  REQUIRE_THAT(refusal("no-bias", family_config(q2), w),
               Catch::Contains("no tensor for blocks.1.attn.v.bias"));
  w = family_weights(q3, 6);
  w["model.layers.0.self_attn.k_norm.weight"] = test::random_tensor({q3.KV * q3.hd()}, 1);
  REQUIRE_THAT(refusal("k-norm", family_config(q3), w),
               Catch::Contains("'model.layers.0.self_attn.k_norm.weight' is [32], but config.json "
                               "implies [16]"));
  Tiny narrow = q2;
  narrow.shared_F = 0;
  w = family_weights(q2, 6);  // 40 wide, config says 0
  REQUIRE_THAT(refusal("shared", family_config(narrow), w),
               Catch::Contains("(shared_expert_intermediate_size 0)"));
}

TEST_CASE("hf families: import -> export -> import is tensor-identical, f32 and bf16", "[hf]") {
  test::ScratchDir dir("hf-families-export");
  for (const std::string& family : kFamilies)
    for (DType dtype : {DType::f32, DType::bf16}) {
      INFO("family " << family << ", " << dtype_name(dtype));
      const Tiny t = tiny_of(family);
      std::map<std::string, Tensor> w;
      for (const auto& [name, tensor] : family_weights(t, 7)) w[name] = tensor.to(dtype);
      const std::string src = dir.file(family + "-" + dtype_name(dtype));
      write_hf_dir(src, family_config(t), w, 2);
      const io::Checkpoint imported = test::import_hf_held(src);

      // Sharded: several files named by the index, the family's names and the source bytes.
      const std::string out = src + "-out";
      io::export_hf(imported, out, {20000});
      REQUIRE(fs::exists(out + "/model.safetensors.index.json"));
      REQUIRE_FALSE(fs::exists(out + "/model.safetensors"));
      const json index = json::parse(test::read_file(out + "/model.safetensors.index.json"));
      REQUIRE(index["weight_map"].size() == w.size());
      std::set<std::string> files;
      for (const auto& [name, tensor] : w) {
        INFO("tensor " << name);
        REQUIRE(index["weight_map"].contains(name));
        const std::string file = index["weight_map"][name].get<std::string>();
        files.insert(file);
        io::SafetensorsReader shard(out + "/" + file);
        REQUIRE(same_bytes(shard.read(name), tensor));
      }
      REQUIRE(files.size() > 1);
      // config.json: the family's keys, read back by a fresh import as the same model.
      const json c = json::parse(test::read_file(out + "/config.json"));
      const json want = family_config(t);
      for (const char* key :
           {"model_type", "num_experts", "num_key_value_heads", "norm_topk_prob", "vocab_size",
            "max_position_embeddings", "tie_word_embeddings", "rope_theta", "architectures",
            "intermediate_size"})  // Qwen's dense width kept (issue 44, defect 6: was F)
        REQUIRE(c[key] == want[key]);
      if (family != "olmoe") REQUIRE(c["moe_intermediate_size"] == t.F);
      if (family == "qwen2_moe") REQUIRE(c["shared_expert_intermediate_size"] == t.shared_F);
      if (family == "qwen3_moe") REQUIRE(c["head_dim"] == t.hd());
      if (family == "olmoe") REQUIRE(c["intermediate_size"] == t.F);
      REQUIRE(c["torch_dtype"] == (dtype == DType::bf16 ? "bfloat16" : "float32"));
      const io::Checkpoint again = test::import_hf_held(out);
      require_same_params(imported, again);
      REQUIRE(again.model_config == imported.model_config);

      // One file, into a directory of its own; a directory holding the other form is refused.
      io::export_hf(again, out + "-single");
      require_same_params(imported, test::import_hf_held(out + "-single"));
      REQUIRE_THAT(test::error_of([&] { io::export_hf(again, out + "-single", {20000}); }),
                   Catch::Contains("already holds model.safetensors"));
      REQUIRE_THAT(test::error_of([&] { io::export_hf(again, out); }),
                   Catch::Contains("already holds model.safetensors.index.json"));
    }

  // A 0-wide Qwen2-MoE shared expert goes out as transformers has it (empty, zero gate) and comes
  // back as nothing.
  Tiny narrow = tiny_of("qwen2_moe");
  narrow.shared_F = 0;
  write_hf_dir(dir.file("narrow"), family_config(narrow), family_weights(narrow, 8), 1);
  const io::Checkpoint imported = test::import_hf_held(dir.file("narrow"));
  io::export_hf(imported, dir.file("narrow-out"));
  io::SafetensorsReader st(dir.file("narrow-out/model.safetensors"));
  REQUIRE(st.find("model.layers.1.mlp.shared_expert.down_proj.weight")->shape ==
          Shape{narrow.D, 0});
  const std::vector<float> gate =
      st.read("model.layers.1.mlp.shared_expert_gate.weight").to_vector();
  REQUIRE(gate == std::vector<float>(size_t(narrow.D), 0.0f));
  require_same_params(imported, test::import_hf_held(dir.file("narrow-out")));
}

TEST_CASE("hf families: export refuses what a family cannot hold, by name", "[hf]") {
  test::ScratchDir dir("hf-families-export-refused");
  const Tiny t = tiny_of("olmoe");
  write_hf_dir(dir.file("olmoe"), family_config(t), family_weights(t, 9), 1);
  const io::Checkpoint ckpt = test::import_hf_held(dir.file("olmoe"));
  auto refusal = [&](auto&& change) {
    io::Checkpoint c = ckpt;
    ModelConfig mc = model_config_from_json(c.model_config);
    change(mc);
    c.model_config = to_json(mc);
    return test::error_of([&] { io::export_hf(c, dir.file("out")); });
  };
  REQUIRE_THAT(refusal([](ModelConfig& mc) { mc.router_scoring = nn::RouterScoring::sigmoid; }),
               Catch::Contains("HF OLMoE routes by a softmax"));
  REQUIRE_THAT(refusal([](ModelConfig& mc) { mc.shared_expert_ff = 8; }),
               Catch::Contains("HF OLMoE has no shared expert"));
  REQUIRE_THAT(refusal([](ModelConfig& mc) { mc.head_dim = 16; }),
               Catch::Contains("heads of hidden_size / num_attention_heads"));
  REQUIRE_THAT(refusal([](ModelConfig& mc) { mc.arch = Arch::qwen2_moe; }),
               Catch::Contains("no parameter 'blocks.0.attn.q.bias'"));
  io::Checkpoint extra = ckpt;
  extra.params.push_back({"blocks.0.moe.shared.w1", Tensor::zeros({2, 2}), false, {}});
  REQUIRE_THAT(test::error_of([&] { io::export_hf(extra, dir.file("out")); }),
               Catch::Contains("'blocks.0.moe.shared.w1' has no place in HF OLMoE"));
  REQUIRE_FALSE(fs::exists(dir.file("out/config.json")));
}

TEST_CASE("hf families: an imported model scores like the family reference", "[hf]") {
  test::ScratchDir dir("hf-families-score");
  const int64_t B = 2, T = 11;
  for (const std::string& family : kFamilies)
    for (bool normalize : {false, true}) {
      INFO("family " << family << ", norm_topk_prob " << normalize);
      Tiny t = tiny_of(family);
      t.norm_topk = normalize;
      const auto w = family_weights(t, 13);
      const std::string src = dir.file(family + (normalize ? "-norm" : ""));
      write_hf_dir(src, family_config(t), w, 2);
      const io::Checkpoint ckpt = test::import_hf_held(src);
      const auto ids = random_token_ids(B * T, int32_t(t.V), 14);
      const std::vector<float> ours = our_logits(ckpt, src + ".h5", ids, B, T);
      // Per window (sequence), f32 logits within 1e-4 of the fp64 reference, relative to their
      // scale: float rounding through a few blocks, far below what a feature left out costs.
      const Vec reference = hf_reference_logits(t, w, ids, B, T, normalize);
      for (int64_t b = 0; b < B; ++b) {
        const size_t n = size_t(T * t.V), at = size_t(b) * n;
        const std::vector<float> mine(ours.begin() + long(at), ours.begin() + long(at + n));
        const Vec want(reference.begin() + long(at), reference.begin() + long(at + n));
        const double error = relative_error(mine, want);
        INFO("window " << b << ": relative error " << error);
        REQUIRE(error < 1e-4);
      }
      // The comparison can fail: the reference with the other renormalisation choice is another
      // model.
      REQUIRE(relative_error(ours, hf_reference_logits(t, w, ids, B, T, !normalize)) > 1e-3);
    }
  // Qwen2-MoE with a 0-wide shared expert (the tensors left out at import) scores the same.
  Tiny narrow = tiny_of("qwen2_moe");
  narrow.shared_F = 0;
  const auto w = family_weights(narrow, 15);
  write_hf_dir(dir.file("narrow"), family_config(narrow), w, 1);
  const auto ids = random_token_ids(T, int32_t(narrow.V), 16);
  const std::vector<float> ours =
      our_logits(test::import_hf_held(dir.file("narrow")), dir.file("narrow.h5"), ids, 1, T);
  REQUIRE(relative_error(ours, hf_reference_logits(narrow, w, ids, 1, T, narrow.norm_topk)) < 1e-4);
}

// Issue 44, defect 1: configs as transformers 5 writes them. Qwen3-MoE's class maps num_experts to
// num_local_experts (attribute_map) and so writes the latter; RoPE goes into rope_parameters;
// Qwen2-MoE lists each layer's attention in layer_types. Each reads as the 4.x form does.
TEST_CASE("hf families: configs as transformers 5 writes them import", "[hf]") {
  test::ScratchDir dir("hf-families-tf5");
  const Tiny q3 = tiny_of("qwen3_moe"), q2 = tiny_of("qwen2_moe");
  auto import_of = [&](const std::string& name, const json& config, const Tiny& t) {
    write_hf_dir(dir.file(name), config, family_weights(t, 9), 1);
    return test::import_hf_held(dir.file(name));
  };
  auto refusal = [&](const std::string& name, const json& config,
                     const std::map<std::string, Tensor>& w) {
    write_hf_dir(dir.file(name), config, w, 1);
    return test::error_of([&] { test::import_hf_held(dir.file(name)); });
  };
  const io::Checkpoint v4 = import_of("qwen3-v4", family_config(q3), q3);
  json v5 = family_config(q3);
  v5.erase("num_experts");
  v5["num_local_experts"] = q3.E;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", q3.theta}};
  const io::Checkpoint imported = import_of("qwen3-v5", v5, q3);
  REQUIRE(imported.model_config == v4.model_config);
  REQUIRE(imported.params.size() == v4.params.size());
  // Both spellings must agree when both are there.
  json both = v5;
  both["num_experts"] = q3.E + 1;
  REQUIRE_THAT(refusal("qwen3-both", both, family_weights(q3, 9)),
               Catch::Contains("\"num_local_experts\" (4) and \"num_experts\" (5) disagree"));
  json partial = v5;
  partial["rope_parameters"]["partial_rotary_factor"] = 0.5;
  REQUIRE_THAT(refusal("qwen3-partial", partial, family_weights(q3, 9)),
               Catch::Contains("partial RoPE (rope_parameters partial_rotary_factor 0.5)"));

  // Qwen2-MoE: a window switched on, but no layer of layer_types slides (max_window_layers 0):
  // transformers attends fully, and so do we. A window on some layers slides those (issue 44).
  json full = family_config(q2);
  full["use_sliding_window"] = true;
  full["sliding_window"] = 16;
  full["layer_types"] = {"full_attention", "full_attention"};
  REQUIRE(import_of("qwen2-full", full, q2).model_config ==
          import_of("qwen2-v4", family_config(q2), q2).model_config);
  json some = full;
  some["layer_types"] = {"sliding_attention", "full_attention"};
  const ModelConfig windowed =
      model_config_from_json(import_of("qwen2-some", some, q2).model_config);
  REQUIRE(windowed.sliding_window == 16);
  REQUIRE(windowed.window_layers == std::vector<int64_t>{0});
  // qkv_bias false: Qwen2-MoE without its q/k/v biases, which our flavour always has.
  json no_bias = family_config(q2);
  no_bias["qkv_bias"] = false;
  auto w = family_weights(q2, 9);
  for (const char* x : {"q", "k", "v"})
    for (int64_t l = 0; l < q2.L; ++l)
      w.erase("model.layers." + std::to_string(l) + ".self_attn." + x + "_proj.bias");
  REQUIRE_THAT(refusal("qwen2-no-bias", no_bias, w),
               Catch::Contains("Qwen2-MoE without q/k/v biases (qkv_bias: false)"));
}
