// Hugging Face export (see moe/io/hf_checkpoint.h and docs/FORMATS.md): a model of the mixtral,
// qwen2_moe, qwen3_moe, olmoe, glm4_moe, deepseek_v3 (a softmax-routed one as deepseek_v2) or
// gpt_oss flavour (io/hf_export_gpt_oss.cpp) as config.json (that family's keys) +
// model.safetensors (or shards named by model.safetensors.index.json) with the family's tensor
// names, each file written atomically.
// Shape letters: V vocabulary, D hidden size, F expert hidden width, Fs shared expert hidden
// width, E experts of a layer, H query heads, KV key/value heads, hd head dim.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "core/json_text.h"
#include "io/export_model.h"
#include "io/files.h"
#include "io/hf_export_gpt_oss.h"
#include "io/hf_mla.h"
#include "io/hf_names.h"
#include "moe/error.h"
#include "moe/io/convert.h"
#include "moe/io/hf_checkpoint.h"
#include "moe/io/input.h"
#include "moe/io/output.h"
#include "moe/io/safetensors.h"
#include "moe/log.h"
#include "moe/models/config.h"
#include "moe/models/flavour.h"
#include "moe/version.h"

namespace moe::io {

namespace hf {

// config.json's torch_dtype of the model's (floating) storage dtype.
const char* torch_dtype_name(DType dtype) {
  return dtype == DType::f32 ? "float32" : dtype == DType::bf16 ? "bfloat16" : "float16";
}

// YaRN's settings under the keys transformers reads (hf_config.cpp parse_yarn reads them back;
// the optional ones only when set), or null without RoPE scaling.
nlohmann::ordered_json yarn_json(const ModelConfig& mc) {
  if (mc.rope_type != RopeType::yarn) return nullptr;
  const ops::YarnSettings& y = mc.yarn;
  nlohmann::ordered_json r;
  r["rope_type"] = "yarn";
  r["factor"] = y.factor;
  if (y.original_ctx == std::floor(y.original_ctx))  // HF writes a count of positions
    r["original_max_position_embeddings"] = static_cast<int64_t>(y.original_ctx);
  else
    r["original_max_position_embeddings"] = y.original_ctx;
  r["beta_fast"] = y.beta_fast;
  r["beta_slow"] = y.beta_slow;
  if (y.mscale > 0) r["mscale"] = y.mscale;
  if (y.mscale_all_dim > 0) r["mscale_all_dim"] = y.mscale_all_dim;
  if (y.attention_factor > 0) r["attention_factor"] = y.attention_factor;
  if (!y.truncate) r["truncate"] = false;
  return r;
}

}  // namespace hf

namespace {

namespace fs = std::filesystem;
using hf::join_path;
using hf::kConfigFile;
using hf::kIndexFile;
using hf::kMetadataConfig;
using hf::kSingleFile;
using hf::torch_dtype_name;
using hf::yarn_json;

// DeepSeek-V2's router (transformers' DeepseekV2TopkRouter) is deepseek_v3's with softmax scores:
// such a model goes out as a DeepseekV2 directory, a sigmoid one as DeepseekV3.
bool deepseek_v2(const ModelConfig& mc) {
  return mc.arch == Arch::deepseek_v3 && mc.router_scoring == nn::RouterScoring::softmax;
}

const char* hf_model_name(const ModelConfig& mc) {
  if (deepseek_v2(mc)) return "HF DeepSeek-V2";
  switch (mc.arch) {
    case Arch::qwen2_moe:
      return "HF Qwen2-MoE";
    case Arch::qwen3_moe:
      return "HF Qwen3-MoE";
    case Arch::olmoe:
      return "HF OLMoE";
    case Arch::glm4_moe:
      return "HF GLM-4-MoE";
    case Arch::deepseek_v3:
      return "HF DeepSeek-V3";
    case Arch::gpt_oss:
      return "HF GptOss";
    default:
      return "HF Mixtral";
  }
}

// The leading dense layers of a glm4_moe model (first_k_dense_replace).
int64_t leading_dense_layers(const ModelConfig& mc) {
  int64_t k = 0;
  while (k < mc.layers && !mc.is_moe_layer(k)) ++k;
  return k;
}

// GLM-4-MoE's config.json (configuration_glm4_moe.py's keys).
nlohmann::ordered_json glm_config(const ModelConfig& mc, int64_t E) {
  const int64_t hd = mc.head_dim_resolved();
  nlohmann::ordered_json c;
  c["architectures"] = {"Glm4MoeForCausalLM"};
  c["model_type"] = "glm4_moe";
  c["vocab_size"] = mc.vocab_size;
  c["hidden_size"] = mc.d_model;
  c["intermediate_size"] = mc.dense_ff_resolved();
  c["moe_intermediate_size"] = mc.d_ff;
  c["num_hidden_layers"] = mc.layers;
  c["num_attention_heads"] = mc.heads;
  c["num_key_value_heads"] = mc.kv_heads_resolved();
  c["head_dim"] = hd;
  c["partial_rotary_factor"] = double(mc.rope_dim_resolved()) / double(hd);
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = mc.seq;
  c["initializer_range"] = 0.02;
  c["rms_norm_eps"] = mc.norm_eps;
  c["use_cache"] = true;
  c["tie_word_embeddings"] = false;
  c["rope_theta"] = mc.rope_theta;
  c["rope_scaling"] = yarn_json(mc);
  c["attention_bias"] = mc.qkv_bias;
  c["attention_dropout"] = 0.0;
  c["num_experts_per_tok"] = mc.top_k;
  c["n_shared_experts"] = mc.shared_expert_ff / mc.d_ff;
  c["n_routed_experts"] = E;
  c["routed_scaling_factor"] = mc.routed_scale;
  c["n_group"] = mc.router_groups;
  c["topk_group"] = mc.router_group_topk;
  c["first_k_dense_replace"] = leading_dense_layers(mc);
  c["norm_topk_prob"] = mc.normalize_topk;
  c["use_qk_norm"] = mc.qk_norm;
  c["output_router_logits"] = false;
  c["router_aux_loss_coef"] = mc.aux_loss_coef;
  c["torch_dtype"] = torch_dtype_name(mc.dtype);
  return c;
}

// DeepSeek-V3's config.json (configuration_deepseek_v3.py's keys; the RoPE rows interleaved), or
// DeepSeek-V2's (configuration_deepseek_v2.py: the same keys less V3's rope_interleave (V2 always
// interleaves), group limit and prediction layers, with its "greedy" top-k and no renormalisation,
// which import-hf requires of V2).
nlohmann::ordered_json deepseek_config(const ModelConfig& mc, int64_t E) {
  const bool v2 = deepseek_v2(mc);
  nlohmann::ordered_json c;
  c["architectures"] = {v2 ? "DeepseekV2ForCausalLM" : "DeepseekV3ForCausalLM"};
  c["model_type"] = v2 ? "deepseek_v2" : "deepseek_v3";
  c["vocab_size"] = mc.vocab_size;
  c["hidden_size"] = mc.d_model;
  c["intermediate_size"] = mc.dense_ff_resolved();
  c["moe_intermediate_size"] = mc.d_ff;
  c["num_hidden_layers"] = mc.layers;
  c["num_attention_heads"] = mc.heads;
  c["num_key_value_heads"] = mc.heads;
  c["head_dim"] = mc.qk_rope_dim;  // as transformers writes it
  c["q_lora_rank"] = mc.q_lora_rank > 0 ? nlohmann::ordered_json(mc.q_lora_rank) : nullptr;
  c["kv_lora_rank"] = mc.kv_lora_rank;
  c["qk_nope_head_dim"] = mc.qk_nope_dim;
  c["qk_rope_head_dim"] = mc.qk_rope_dim;
  c["v_head_dim"] = mc.v_head_dim;
  if (!v2) c["rope_interleave"] = true;
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = mc.seq;
  c["initializer_range"] = 0.02;
  c["rms_norm_eps"] = mc.norm_eps;
  c["use_cache"] = true;
  c["tie_word_embeddings"] = false;
  c["rope_parameters"] = {{"rope_theta", mc.rope_theta}, {"rope_type", "default"}};
  if (mc.rope_type == RopeType::yarn) {
    c["rope_parameters"] = yarn_json(mc);
    c["rope_parameters"]["rope_theta"] = mc.rope_theta;
  }
  c["attention_bias"] = false;
  c["attention_dropout"] = 0.0;
  c["num_experts_per_tok"] = mc.top_k;
  c["n_shared_experts"] = mc.shared_expert_ff / mc.d_ff;
  c["n_routed_experts"] = E;
  c["routed_scaling_factor"] = mc.routed_scale;
  if (v2) {
    c["topk_method"] = "greedy";
  } else {
    c["n_group"] = mc.router_groups;
    c["topk_group"] = mc.router_group_topk;
  }
  c["first_k_dense_replace"] = leading_dense_layers(mc);
  c["norm_topk_prob"] = mc.normalize_topk;
  if (!v2) c["num_nextn_predict_layers"] = 0;
  c["torch_dtype"] = torch_dtype_name(mc.dtype);
  return c;
}

// Refuses a glm4_moe or deepseek_v3 model config.json cannot describe.
void check_glm(const ModelConfig& mc) {
  const int64_t hd = mc.head_dim_resolved(), rd = mc.rope_dim_resolved();
  if (mc.shared_expert_ff % mc.d_ff != 0)
    throw Error(str("Hugging Face export: HF GLM-4-MoE's shared experts are n_shared_experts x ",
                    "moe_intermediate_size (", mc.d_ff, ") wide; this model's are ",
                    mc.shared_expert_ff));
  if (!mc.mla() && static_cast<int64_t>(double(hd) * (double(rd) / double(hd))) != rd)
    throw Error(str("Hugging Face export: RoPE on ", rd, " of ", hd,
                    " features a head has no exact partial_rotary_factor"));
  for (int64_t i = 0; i < mc.layers; ++i)
    if (i >= leading_dense_layers(mc) && !mc.is_moe_layer(i))
      throw Error(str("Hugging Face export: layer ", i, " is dense after an MoE layer; HF ",
                      "GLM-4-MoE's dense layers are the first ones (first_k_dense_replace)"));
}

// Refuses a softmax-routed deepseek_v3 model transformers' DeepSeek-V2 would route otherwise: it
// never renormalises the top-k, has no selection bias, and limits groups by their best expert
// (ours by their two best), so only "greedy" (no group limit) goes out.
void check_deepseek_v2(const ModelConfig& mc) {
  const char* differs = mc.normalize_topk            ? "renormalises the top-k (normalize_topk)"
                        : mc.router_selection_bias() ? "carries a selection bias"
                        : mc.router_groups > 1 && mc.router_group_topk < mc.router_groups
                            ? "limits its choice to groups of experts (router_groups)"
                            : nullptr;
  if (differs)
    throw Error(str("Hugging Face export: this softmax-routed deepseek_v3 model (HF DeepSeek-V2) ",
                    differs, ", which transformers' DeepseekV2 router does not"));
}

// config.json with the keys the family's transformers config class writes.
nlohmann::ordered_json family_config(const ModelConfig& mc, int64_t E, bool mxfp4) {
  if (mc.arch == Arch::glm4_moe) return glm_config(mc, E);
  if (mc.arch == Arch::deepseek_v3) return deepseek_config(mc, E);
  if (mc.arch == Arch::gpt_oss) return hf::gpt_oss_config(mc, E, mxfp4);
  const int64_t D = mc.d_model, H = mc.heads, hd = mc.head_dim_resolved();
  nlohmann::ordered_json c;
  const bool mixtral = mc.arch == Arch::mixtral, qwen2 = mc.arch == Arch::qwen2_moe;
  const bool qwen3 = mc.arch == Arch::qwen3_moe, olmoe = mc.arch == Arch::olmoe;
  c["architectures"] = {mixtral ? "MixtralForCausalLM"
                        : qwen2 ? "Qwen2MoeForCausalLM"
                        : qwen3 ? "Qwen3MoeForCausalLM"
                                : "OlmoeForCausalLM"};
  c["model_type"] = arch_name(mc.arch);
  c["vocab_size"] = mc.vocab_size;
  c["hidden_size"] = D;
  // Mixtral, OLMoE: the experts' width. Qwen: the dense MLP of mlp_only_layers, which we never
  // have (its width kept from import, dense_ff); the experts are moe_intermediate_size wide.
  c["intermediate_size"] = qwen2 || qwen3 ? mc.dense_ff_resolved() : mc.d_ff;
  if (qwen2 || qwen3) c["moe_intermediate_size"] = mc.d_ff;
  c["num_hidden_layers"] = mc.layers;
  c["num_attention_heads"] = H;
  c["num_key_value_heads"] = mc.kv_heads_resolved();
  if (mixtral || qwen3) c["head_dim"] = hd;
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = mc.seq;
  c["initializer_range"] = 0.02;
  c["rms_norm_eps"] = mc.norm_eps;
  c["use_cache"] = true;
  c["tie_word_embeddings"] = false;
  c["rope_theta"] = mc.rope_theta;
  c["rope_scaling"] = yarn_json(mc);
  c["attention_dropout"] = 0.0;
  if (olmoe || qwen3) c["attention_bias"] = false;
  if (olmoe) c["clip_qkv"] = nullptr;
  if (mixtral) {
    c["sliding_window"] = nullptr;
    c["num_local_experts"] = E;
    c["router_jitter_noise"] = mc.router_jitter;
  } else {
    c["num_experts"] = E;
    c["norm_topk_prob"] = mc.normalize_topk;
  }
  if (qwen2 || qwen3) {
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
    c["max_window_layers"] = mc.layers;
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = nlohmann::json::array();
  }
  if (qwen2) c["shared_expert_intermediate_size"] = mc.shared_expert_ff;
  c["num_experts_per_tok"] = mc.top_k;
  c["output_router_logits"] = false;
  c["router_aux_loss_coef"] = mc.aux_loss_coef;
  c["torch_dtype"] = torch_dtype_name(mc.dtype);
  return c;
}

// The sliding window and the tied head under the keys the family's class reads (parse_window in
// hf_config.cpp reads them back): Mixtral's sliding_window, Qwen3-MoE's use_sliding_window and
// sliding_window (every layer), Qwen2-MoE's the same with each layer's type in layer_types.
void window_and_tie(const ModelConfig& mc, nlohmann::ordered_json& c) {
  c["tie_word_embeddings"] = mc.tie_embeddings;
  if (mc.sliding_window == 0 || mc.arch == Arch::gpt_oss) return;  // gpt_oss: in layer_types
  if (mc.arch == Arch::mixtral) {
    c["sliding_window"] = mc.sliding_window;
    return;
  }
  c["use_sliding_window"] = true;
  c["sliding_window"] = mc.sliding_window;
  if (mc.arch != Arch::qwen2_moe) return;
  auto types = nlohmann::ordered_json::array();
  for (int64_t i = 0; i < mc.layers; ++i)
    types.push_back(mc.window_of(i) > 0 ? "sliding_attention" : "full_attention");
  c["layer_types"] = types;
}

// Refuses a window the family's config.json cannot say (Qwen2-MoE's and gpt-oss's layer_types
// say any set of windowed layers).
void check_window(const ModelConfig& mc) {
  if (mc.sliding_window == 0 || mc.arch == Arch::qwen2_moe || mc.arch == Arch::gpt_oss) return;
  const int64_t windowed =
      mc.window_layers.empty() ? mc.layers : static_cast<int64_t>(mc.window_layers.size());
  if (mc.arch != Arch::mixtral && mc.arch != Arch::qwen3_moe)
    throw Error(str("Hugging Face export: transformers' ", hf_model_name(mc),
                    " has no sliding window; this model attends through one of ", mc.sliding_window,
                    " positions"));
  if (windowed < mc.layers)
    throw Error(str("Hugging Face export: transformers' ", hf_model_name(mc),
                    " slides its window on every layer or on none; this model's window of ",
                    mc.sliding_window, " positions is on ", windowed, " of its ", mc.layers,
                    " layers (qwen2_moe's layer_types can say that)"));
}

// The bytes of a tensor's values, held or not.
int64_t data_bytes(const NamedTensor& nt) {
  return shape_numel(nt.shape()) * static_cast<int64_t>(dtype_size(nt.dtype()));
}

// Expert e of `param` [E, ...] as the tensor `hf_name` of `shape`: a view of a held parameter,
// else read when written (one expert of a streamed parameter).
NamedTensor expert_of(const std::string& hf_name, const NamedTensor& param, int64_t e,
                      const Shape& shape) {
  if (param.held()) return {hf_name, param.tensor.rows(e, e + 1).reshape(shape), false, {}};
  auto source = std::make_shared<TensorSource>();
  source->shape = shape;
  source->dtype = param.dtype();
  source->read = [param, e, shape] { return param.expert_slice(e).reshape(shape); };
  NamedTensor out{hf_name, Tensor(), false, {}};
  out.deferred = std::move(source);
  return out;
}

// The HF tensors of the model, in HF's order, viewing our parameters (expert slices included);
// those of a lazily opened checkpoint stay lazy (read one at a time as the files are written).
// mxfp4: gpt-oss's experts kept as MXFP4 blocks (hf::kept_mxfp4_experts).
class HfTensors {
 public:
  HfTensors(ExportModel& m, bool mxfp4)
      : m_(m), mc_(m.config()), flavour_(flavour_of(mc_)), mxfp4_(mxfp4) {}

  std::vector<NamedTensor> all() {
    const int64_t V = mc_.vocab_size, D = mc_.d_model;
    emit("model.embed_tokens.weight", param("embed.tokens", {V, D}));
    for (int64_t i = 0; i < mc_.layers; ++i) layer(i);
    if (mc_.arch == Arch::gpt_oss)
      out_.push_back(hf::f32_norm("model.norm.weight", param("final_norm.weight", {D})));
    else
      emit("model.norm.weight", param("final_norm.weight", {D}));
    // A tied head has no tensor of its own: transformers ties lm_head to embed_tokens on load.
    if (!mc_.tie_embeddings) emit("lm_head.weight", param("lm_head.weight", {V, D}));
    m_.refuse_unused();
    return std::move(out_);
  }

 private:
  // Every tensor written is in the model's dtype (HF's config has one torch_dtype).
  const NamedTensor& checked(const NamedTensor& nt) const {
    if (nt.dtype() != mc_.dtype)
      throw Error(str("Hugging Face export: parameter '", nt.name, "' is ", dtype_name(nt.dtype()),
                      ", but the model's dtype is ", dtype_name(mc_.dtype)));
    return nt;
  }
  const NamedTensor& param(const std::string& name, const Shape& shape) {
    return checked(m_.param(name, shape));
  }
  hf::ParamFn param_fn() {
    return [this](const std::string& name, const Shape& shape) -> const NamedTensor& {
      return param(name, shape);
    };
  }
  void emit(const std::string& hf_name, const NamedTensor& nt) {
    NamedTensor renamed = nt;
    renamed.name = hf_name;
    renamed.expert = false;
    out_.push_back(std::move(renamed));
  }
  NamedTensor zeros(const Shape& shape) const {
    return NamedTensor{"", Tensor::zeros(shape, mc_.dtype), false, {}};
  }
  void layer(int64_t i);
  void attention(const std::string& ours, const std::string& hf);
  void experts(const std::string& ours, const std::string& moe);
  void shared_expert(const std::string& ours, const std::string& moe);

  ExportModel& m_;
  const ModelConfig& mc_;
  const Flavour flavour_;
  const bool mxfp4_;
  std::vector<NamedTensor> out_;
};

// Layer i: gpt-oss's (hf::gpt_oss_layer_tensors), or the norms, the attention and the dense MLP or
// the MoE block.
void HfTensors::layer(int64_t i) {
  const int64_t D = mc_.d_model;
  const std::string ours = str("blocks.", i, "."), hf = str("model.layers.", i, ".");
  const std::string moe = hf + (mc_.arch == Arch::mixtral ? "block_sparse_moe." : "mlp.");
  if (mc_.arch == Arch::gpt_oss) {
    for (NamedTensor& nt : hf::gpt_oss_layer_tensors(m_, i, param_fn(), mxfp4_))
      out_.push_back(std::move(nt));
    return;
  }
  emit(hf + "input_layernorm.weight", param(ours + "norm1.weight", {D}));
  attention(ours, hf);
  if (!mc_.is_moe_layer(i)) {  // GLM's first dense layers
    const int64_t Fd = mc_.dense_ff_resolved();
    emit(hf + "mlp.gate_proj.weight", param(ours + "mlp.w1", {Fd, D}));
    emit(hf + "mlp.up_proj.weight", param(ours + "mlp.w3", {Fd, D}));
    emit(hf + "mlp.down_proj.weight", param(ours + "mlp.w2", {D, Fd}));
    emit(hf + "post_attention_layernorm.weight", param(ours + "norm2.weight", {D}));
    return;
  }
  const int64_t E = m_.experts();
  emit(moe + "gate.weight", checked(m_.router_weight(ours, E, D)));
  // transformers keeps e_score_correction_bias in f32, as our selection bias is
  if (flavour_.router_bias)
    emit(moe + "gate.e_score_correction_bias", m_.param(ours + "moe.router.bias", {E}));
  experts(ours, moe);
  shared_expert(ours, moe);
  emit(hf + "post_attention_layernorm.weight", param(ours + "norm2.weight", {D}));
}

// The attention's projections (latent attention: hf::mla_hf_tensors), biases and qk-norms.
void HfTensors::attention(const std::string& ours, const std::string& hf) {
  const int64_t D = mc_.d_model, H = mc_.heads, KV = mc_.kv_heads_resolved();
  const int64_t hd = mc_.head_dim_resolved();
  if (flavour_.latent_attention) {
    for (NamedTensor& nt : hf::mla_hf_tensors(mc_, ours, hf + "self_attn.", param_fn()))
      out_.push_back(std::move(nt));
  } else {
    emit(hf + "self_attn.q_proj.weight", param(ours + "attn.q.weight", {H * hd, D}));
    emit(hf + "self_attn.k_proj.weight", param(ours + "attn.k.weight", {KV * hd, D}));
    emit(hf + "self_attn.v_proj.weight", param(ours + "attn.v.weight", {KV * hd, D}));
    emit(hf + "self_attn.o_proj.weight", param(ours + "attn.o.weight", {D, H * hd}));
  }
  if (flavour_.qkv_bias) {
    emit(hf + "self_attn.q_proj.bias", param(ours + "attn.q.bias", {H * hd}));
    emit(hf + "self_attn.k_proj.bias", param(ours + "attn.k.bias", {KV * hd}));
    emit(hf + "self_attn.v_proj.bias", param(ours + "attn.v.bias", {KV * hd}));
  }
  if (flavour_.qk_norm != nn::QkNorm::none) {
    const bool head = flavour_.qk_norm == nn::QkNorm::head;
    emit(hf + "self_attn.q_norm.weight", param(ours + "attn.q_norm.weight", {head ? hd : H * hd}));
    emit(hf + "self_attn.k_norm.weight", param(ours + "attn.k_norm.weight", {head ? hd : KV * hd}));
  }
}

// Each expert's three matrices as tensors of their own (Mixtral's w1/w2/w3 names, or the others'
// gate/down/up_proj).
void HfTensors::experts(const std::string& ours, const std::string& moe) {
  const int64_t D = mc_.d_model, F = mc_.d_ff, E = m_.experts();
  const bool mixtral = mc_.arch == Arch::mixtral;
  const NamedTensor& w1 = param(ours + "moe.experts.w1", {E, F, D});
  const NamedTensor& w2 = param(ours + "moe.experts.w2", {E, D, F});
  const NamedTensor& w3 = param(ours + "moe.experts.w3", {E, F, D});
  for (int64_t e = 0; e < E; ++e) {
    const std::string ex = str(moe, "experts.", e, ".");
    out_.push_back(expert_of(ex + (mixtral ? "w1.weight" : "gate_proj.weight"), w1, e, {F, D}));
    out_.push_back(expert_of(ex + (mixtral ? "w2.weight" : "down_proj.weight"), w2, e, {D, F}));
    out_.push_back(expert_of(ex + (mixtral ? "w3.weight" : "up_proj.weight"), w3, e, {F, D}));
  }
}

// GLM's and DeepSeek's ungated shared experts, or Qwen2-MoE's gated one.
void HfTensors::shared_expert(const std::string& ours, const std::string& moe) {
  const int64_t D = mc_.d_model, Fs = mc_.shared_expert_ff;
  if (flavour_.ungated_shared_expert && Fs > 0) {
    const std::string sh = moe + "shared_experts.";
    emit(sh + "gate_proj.weight", param(ours + "moe.shared.w1", {Fs, D}));
    emit(sh + "up_proj.weight", param(ours + "moe.shared.w3", {Fs, D}));
    emit(sh + "down_proj.weight", param(ours + "moe.shared.w2", {D, Fs}));
  }
  if (!flavour_.shared_expert_gate) return;
  // transformers' Qwen2-MoE always has the shared expert and its gate: a 0-wide one is written
  // empty, with a zero gate (it adds nothing, as ours).
  const std::string sh = moe + "shared_expert.";
  if (Fs > 0) {
    emit(sh + "gate_proj.weight", param(ours + "moe.shared.w1", {Fs, D}));
    emit(sh + "up_proj.weight", param(ours + "moe.shared.w3", {Fs, D}));
    emit(sh + "down_proj.weight", param(ours + "moe.shared.w2", {D, Fs}));
    emit(moe + "shared_expert_gate.weight", param(ours + "moe.shared_gate.weight", {1, D}));
  } else {
    emit(sh + "gate_proj.weight", zeros({0, D}));
    emit(sh + "up_proj.weight", zeros({0, D}));
    emit(sh + "down_proj.weight", zeros({D, 0}));
    emit(moe + "shared_expert_gate.weight", zeros({1, D}));
  }
}

// `tensors` in one shard, or in shards of at most max_bytes each (a tensor never split), as
// transformers' save_pretrained cuts them.
std::vector<std::vector<NamedTensor>> plan_shards(const std::vector<NamedTensor>& tensors,
                                                  int64_t max_bytes) {
  std::vector<std::vector<NamedTensor>> shards(1);
  int64_t in_shard = 0;
  for (const NamedTensor& nt : tensors) {
    const int64_t bytes = data_bytes(nt);
    if (max_bytes > 0 && in_shard > 0 && in_shard + bytes > max_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(nt);
    in_shard += bytes;
  }
  return shards;
}

// The file of shard `s` of `count` (sharded exports only).
std::string shard_file(size_t s, size_t count) {
  char file[64];
  std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", s + 1, count);
  return file;
}

// Every file of `dir` the export writes: an existing one only with `replace` (--force), checked
// before the first is written. A directory holding the other form (an index beside one file, or
// model.safetensors beside shards) is refused even then: a loader would read that one instead.
void check_export_files(const std::string& dir, size_t shard_count, bool sharded,
                        const Checkpoint& ckpt, bool replace) {
  if (!sharded && path_exists(join_path(dir, kIndexFile)))
    throw Error(str("Hugging Face export: '", dir, "' already holds ", kIndexFile,
                    " (a sharded checkpoint, which loaders would read instead); export into an "
                    "empty directory"));
  if (sharded && path_exists(join_path(dir, kSingleFile)))
    throw Error(str("Hugging Face export: '", dir, "' already holds ", kSingleFile,
                    " (which loaders would read instead of the shards); export into an empty "
                    "directory"));
  std::vector<std::string> files = {kConfigFile};
  if (!ckpt.tokenizer.empty()) files.push_back(ckpt.tokenizer.file);
  if (!sharded) files.push_back(kSingleFile);
  if (sharded) files.push_back(kIndexFile);
  for (size_t s = 0; sharded && s < shard_count; ++s) files.push_back(shard_file(s, shard_count));
  for (const std::string& file : files) check_output_file(join_path(dir, file), replace);
}

// Writes the shards as one file, or as shard files named by an index.
void write_tensors(const std::string& dir, const std::vector<std::vector<NamedTensor>>& shards,
                   const std::map<std::string, std::string>& metadata, bool sharded) {
  if (!sharded) {
    write_safetensors(join_path(dir, kSingleFile), shards.front(), metadata);
    return;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int64_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shard_file(s, shards.size());
    for (const NamedTensor& nt : shards[s]) {
      weight_map[nt.name] = file;
      total += data_bytes(nt);
    }
    write_safetensors(join_path(dir, file), shards[s], metadata);
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  write_text_atomic(join_path(dir, kIndexFile), index.dump(2) + "\n");
}

// The shard files the index of an earlier export in `dir` names, less `kept` (this export's own):
// what a sharded export over it (--force) removes once its own index is written, so that the
// directory holds one model. Only names of our shard naming are taken, never another file of the
// user's; an index that does not read names nothing (its shards stay, and a warning says so).
std::vector<std::string> stale_shards(const std::string& dir, const std::set<std::string>& kept) {
  const std::string index = join_path(dir, kIndexFile);
  std::vector<std::string> stale;
  if (!path_exists(index)) return stale;
  std::ifstream in(index, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = parse_json(text.str(), str("'", index, "'"));
  } catch (const Error& e) {
    MOE_LOG_WARN("Hugging Face export: ", e.what(), ": the shards it names stay in '", dir, "'");
    return stale;
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) return stale;
  static const std::regex ours(R"(model-[0-9]{5}-of-[0-9]{5}\.safetensors)");
  std::set<std::string> named;
  for (const auto& entry : j["weight_map"].items())
    if (entry.value().is_string()) named.insert(entry.value().get<std::string>());
  for (const std::string& file : named)
    if (std::regex_match(file, ours) && !kept.count(file)) stale.push_back(file);
  return stale;
}

// The output directory of an export, removed again (with what the export wrote in it) when the
// export fails after creating it: tensors are read as they are written, so a NaN or a damaged
// chunk can stop it half way. A directory that existed before is left as it is.
class CreatedDir {
 public:
  explicit CreatedDir(std::string dir) : dir_(std::move(dir)), created_(!path_exists(dir_)) {}
  CreatedDir(const CreatedDir&) = delete;
  CreatedDir& operator=(const CreatedDir&) = delete;
  ~CreatedDir() {
    std::error_code ignored;
    if (created_ && !kept_) fs::remove_all(dir_, ignored);
  }
  void keep() { kept_ = true; }

 private:
  std::string dir_;
  bool created_ = false, kept_ = false;
};

// Whether the experts go out as gpt-oss's MXFP4 blocks, as the released checkpoints hold them
// (hf::kept_mxfp4_experts); any other quantised checkpoint is refused.
bool mxfp4_experts(const Checkpoint& ckpt, const ModelConfig& peek) {
  const bool mxfp4 = peek.arch == Arch::gpt_oss && hf::kept_mxfp4_experts(ckpt.model_config, peek);
  const std::string quantization = quantization_of(ckpt.model_config);
  if (!quantization.empty() && !mxfp4)
    throw Error(str("Hugging Face export: this checkpoint holds ", quantization,
                    "-quantised weights, which ", hf_model_name(peek),
                    " files hold in a float dtype; export the checkpoint that was quantised"));
  return mxfp4;
}

// What the family's HF model cannot hold beyond ExportModel's checks, refused by name: Mixtral's
// fixed renormalisation, Qwen2-MoE's and OLMoE's head width, GLM's, DeepSeek's and gpt-oss's
// own limits, a window the family cannot say, a shared expert it has no place for.
void check_family(const ModelConfig& mc) {
  if (mc.arch == Arch::mixtral && !mc.normalize_topk)
    throw Error(
        "Hugging Face export: HF Mixtral renormalises the top-k gate weights; this model does not "
        "(normalize_topk false)");
  if ((mc.arch == Arch::qwen2_moe || mc.arch == Arch::olmoe) &&
      mc.head_dim_resolved() * mc.heads != mc.d_model)
    throw Error(str("Hugging Face export: ", hf_model_name(mc),
                    " has heads of hidden_size / "
                    "num_attention_heads; this model's are ",
                    mc.head_dim_resolved(), " wide"));
  const bool deepseek = mc.arch == Arch::deepseek_v3;
  if (mc.arch == Arch::glm4_moe || deepseek) check_glm(mc);
  if (deepseek_v2(mc)) check_deepseek_v2(mc);
  if (mc.arch == Arch::gpt_oss) hf::check_gpt_oss(mc);
  check_window(mc);
  if (mc.shared_expert_ff > 0 && mc.arch != Arch::qwen2_moe && mc.arch != Arch::glm4_moe &&
      !deepseek)
    throw Error(str("Hugging Face export: ", hf_model_name(mc),
                    " has no shared expert; this model's "
                    "is ",
                    mc.shared_expert_ff, " wide (qwen2_moe and glm4_moe have one)"));
}

}  // namespace

void export_hf(const Checkpoint& ckpt, const std::string& dir, const HfExportOptions& options) {
  const ModelConfig peek = model_config_from_json(ckpt.model_config);
  const bool mxfp4 = mxfp4_experts(ckpt, peek);
  ExportModel m(ckpt, "Hugging Face export", hf_model_name(peek));
  const ModelConfig& mc = m.config();
  check_family(mc);
  const std::vector<NamedTensor> out = HfTensors(m, mxfp4).all();
  const bool sharded = options.max_shard_bytes > 0;
  const std::vector<std::vector<NamedTensor>> shards = plan_shards(out, options.max_shard_bytes);
  check_export_files(dir, shards.size(), sharded, ckpt, options.replace);

  std::set<std::string> own_shards;
  for (size_t s = 0; sharded && s < shards.size(); ++s)
    own_shards.insert(shard_file(s, shards.size()));
  const std::vector<std::string> stale =
      sharded ? stale_shards(dir, own_shards) : std::vector<std::string>();

  CreatedDir output(dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(str("Hugging Face export: cannot create '", dir, "': ", ec.message()));
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {kMetadataConfig, to_json(m.recorded_config()).dump()},
      {"moe.producer", str("libmoe ", version(), " (git ", git_revision(), ")")}};
  write_tensors(dir, shards, metadata, sharded);
  nlohmann::ordered_json config = family_config(mc, m.experts(), mxfp4);
  window_and_tie(mc, config);
  write_text_atomic(join_path(dir, kConfigFile), config.dump(2) + "\n");
  // The tokenizer an import kept goes back out beside the model, verbatim.
  if (!ckpt.tokenizer.empty())
    write_text_atomic(join_path(dir, ckpt.tokenizer.file), ckpt.tokenizer.bytes);
  // Only now, with the new index in place, do the old shards go: a failure before it leaves the
  // earlier export whole.
  for (const std::string& file : stale) {
    if (!fs::remove(join_path(dir, file), ec) && ec)
      MOE_LOG_WARN("Hugging Face export: cannot remove the earlier shard '", join_path(dir, file),
                   "': ", ec.message());
  }
  fsync_path(dir, true);
  output.keep();
}

}  // namespace moe::io
