// Hugging Face Mixtral export (see moe/io/hf_checkpoint.h and docs/FORMATS.md): our mixtral
// flavour as config.json + model.safetensors with per-expert HF names, each written atomically.
// Shape letters: V vocabulary, D hidden size, F expert hidden width, E experts of a layer,
// H query heads, KV key/value heads, hd = D / H head dim.
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "io/files.h"
#include "io/hf_names.h"
#include "moe/error.h"
#include "moe/io/hf_checkpoint.h"
#include "moe/io/safetensors.h"
#include "moe/models/config.h"
#include "moe/version.h"

namespace moe::io {

namespace fs = std::filesystem;
using hf::join_path;
using hf::kConfigFile;
using hf::kIndexFile;
using hf::kMetadataConfig;
using hf::kSingleFile;

void export_hf(const Checkpoint& ckpt, const std::string& dir) {
  const ModelConfig mc = model_config_from_json(ckpt.model_config);
  if (mc.arch != Arch::mixtral)
    throw Error(str("export_hf: only the mixtral flavour has a Hugging Face form (this model is ",
                    arch_name(mc.arch), ")"));
  const int64_t E = mc.experts_per_layer.empty() ? 0 : mc.experts_per_layer.front();
  for (int64_t i = 0; i < mc.layers; ++i) {
    const int64_t experts = mc.experts_per_layer[static_cast<size_t>(i)];
    if (experts == 0)
      throw Error(str("export_hf: layer ", i,
                      " is dense (no experts); HF Mixtral has experts in every layer"));
    if (experts != E)
      throw Error(str("export_hf: HF Mixtral has the same number of experts in every layer; layer ",
                      i, " has ", experts, ", layer 0 has ", E));
  }
  if (mc.residual_moe) throw Error("export_hf: residual MoE (PR-MoE) has no HF Mixtral form");
  if (!mc.normalize_topk)
    throw Error(
        "export_hf: HF Mixtral renormalises the top-k gate weights; this model does not "
        "(normalize_topk false)");
  if (ckpt.sharding.rank >= 0)
    throw Error(str("export_hf: this is rank ", ckpt.sharding.rank,
                    "'s shard of a sharded checkpoint; merge it first"));
  std::map<std::string, const NamedTensor*> params;
  for (const NamedTensor& nt : ckpt.params) {
    if (nt.shard.defined())
      throw Error(
          str("export_hf: parameter '", nt.name, "' is a shard; merge the checkpoint first"));
    params[nt.name] = &nt;
  }
  const int64_t V = mc.vocab_size, D = mc.d_model, F = mc.d_ff, H = mc.heads;
  const int64_t KV = mc.kv_heads_resolved(), hd = D / H;
  std::set<std::string> used;
  auto param = [&](const std::string& name, const Shape& shape) -> const Tensor& {
    auto it = params.find(name);
    if (it == params.end())
      throw Error(str("export_hf: the checkpoint has no parameter '", name, "'"));
    const Tensor& t = it->second->tensor;
    if (t.shape() != shape || t.dtype() != mc.dtype)
      throw Error(str("export_hf: parameter ", t.describe(), " ('", name, "') should be ",
                      shape_str(shape), " ", dtype_name(mc.dtype)));
    used.insert(name);
    return t;
  };
  std::vector<NamedTensor> out;
  auto emit = [&](const std::string& hf_name, const Tensor& t) {
    out.push_back({hf_name, t, false, {}});
  };
  emit("model.embed_tokens.weight", param("embed.tokens", {V, D}));
  for (int64_t i = 0; i < mc.layers; ++i) {
    const std::string ours = str("blocks.", i, "."), hf = str("model.layers.", i, ".");
    emit(hf + "input_layernorm.weight", param(ours + "norm1.weight", {D}));
    emit(hf + "self_attn.q_proj.weight", param(ours + "attn.q.weight", {H * hd, D}));
    emit(hf + "self_attn.k_proj.weight", param(ours + "attn.k.weight", {KV * hd, D}));
    emit(hf + "self_attn.v_proj.weight", param(ours + "attn.v.weight", {KV * hd, D}));
    emit(hf + "self_attn.o_proj.weight", param(ours + "attn.o.weight", {D, H * hd}));
    emit(hf + "block_sparse_moe.gate.weight", param(ours + "moe.router.weight", {E, D}));
    const Tensor& w1 = param(ours + "moe.experts.w1", {E, F, D});
    const Tensor& w2 = param(ours + "moe.experts.w2", {E, D, F});
    const Tensor& w3 = param(ours + "moe.experts.w3", {E, F, D});
    for (int64_t e = 0; e < E; ++e) {
      const std::string ex = str(hf, "block_sparse_moe.experts.", e, ".");
      emit(ex + "w1.weight", w1.rows(e, e + 1).reshape({F, D}));
      emit(ex + "w2.weight", w2.rows(e, e + 1).reshape({D, F}));
      emit(ex + "w3.weight", w3.rows(e, e + 1).reshape({F, D}));
    }
    emit(hf + "post_attention_layernorm.weight", param(ours + "norm2.weight", {D}));
  }
  emit("model.norm.weight", param("final_norm.weight", {D}));
  emit("lm_head.weight", param("lm_head.weight", {V, D}));
  for (const auto& [name, nt] : params)
    if (!used.count(name))
      throw Error(str("export_hf: parameter '", name, "' has no place in HF Mixtral"));

  const char* torch_dtype = mc.dtype == DType::f32    ? "float32"
                            : mc.dtype == DType::bf16 ? "bfloat16"
                                                      : "float16";
  nlohmann::ordered_json config;
  config["architectures"] = {"MixtralForCausalLM"};
  config["model_type"] = "mixtral";
  config["vocab_size"] = V;
  config["hidden_size"] = D;
  config["intermediate_size"] = F;
  config["num_hidden_layers"] = mc.layers;
  config["num_attention_heads"] = H;
  config["num_key_value_heads"] = KV;
  config["head_dim"] = hd;
  config["hidden_act"] = "silu";
  config["max_position_embeddings"] = mc.seq;
  config["rms_norm_eps"] = mc.norm_eps;
  config["rope_theta"] = mc.rope_theta;
  config["sliding_window"] = nullptr;
  config["num_local_experts"] = E;
  config["num_experts_per_tok"] = mc.top_k;
  config["router_aux_loss_coef"] = mc.aux_loss_coef;
  config["router_jitter_noise"] = mc.router_jitter;
  config["output_router_logits"] = false;
  config["attention_dropout"] = 0.0;
  config["initializer_range"] = 0.02;
  config["tie_word_embeddings"] = false;
  config["use_cache"] = true;
  config["torch_dtype"] = torch_dtype;

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(str("export_hf: cannot create '", dir, "': ", ec.message()));
  if (fs::exists(join_path(dir, kIndexFile)))
    throw Error(str("export_hf: '", dir, "' already holds ", kIndexFile,
                    " (a sharded checkpoint, which loaders would read instead); export into an "
                    "empty directory"));
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {kMetadataConfig, to_json(mc).dump()},
      {"moe.producer", str("libmoe ", version(), " (git ", git_revision(), ")")}};
  write_safetensors(join_path(dir, kSingleFile), out, metadata);
  write_text_atomic(join_path(dir, kConfigFile), config.dump(2) + "\n");
  // The tokenizer an import kept goes back out beside the model, verbatim.
  if (!ckpt.tokenizer.empty())
    write_text_atomic(join_path(dir, ckpt.tokenizer.file), ckpt.tokenizer.bytes);
  fsync_path(dir, true);
}

}  // namespace moe::io
