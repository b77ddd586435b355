// Hugging Face MoE checkpoint import (see moe/io/hf_checkpoint.h and docs/FORMATS.md); export is
// hf_export.cpp.
// Shape letters: V vocabulary, D hidden size, F expert hidden width, Fs shared expert hidden
// width, E experts of a layer, H query heads, KV key/value heads, hd head dim (D / H unless
// config.json's head_dim says otherwise).
#include "moe/io/hf_checkpoint.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "core/json_text.h"
#include "io/files.h"
#include "io/hf_config.h"
#include "io/hf_gpt_oss.h"
#include "io/hf_mla.h"
#include "io/hf_names.h"
#include "io/hf_sources.h"
#include "moe/error.h"
#include "moe/io/convert.h"
#include "moe/io/finite.h"
#include "moe/io/input.h"
#include "moe/io/safetensors.h"
#include "moe/io/tokenizer.h"
#include "moe/models/config.h"
#include "moe/models/flavour.h"
#include "moe/settings.h"
#include "moe/version.h"

namespace moe::io {

namespace {

namespace fs = std::filesystem;
using hf::Classified;
using hf::classify;
using hf::HfModel;
using hf::join_path;
using hf::kConfigFile;
using hf::kMetadataConfig;
using hf::open_sources;
using hf::parse_config;
using hf::read_json_file;
using hf::Slot;
using hf::slot_name;
using hf::Sources;
using nlohmann::json;

// Where each of a layer's parameters comes from (HF names; "" = not found).
struct LayerSources {
  std::map<Slot, std::string> single;                   // norms, attention, router, fused
  std::map<Slot, std::vector<std::string>> per_expert;  // w1/w2/w3, E names each
};

void add_unique(std::vector<std::string>& list, const std::string& item) {
  if (std::find(list.begin(), list.end(), item) == list.end()) list.push_back(item);
}

std::string list_some(const std::vector<std::string>& items, size_t limit = 8) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < limit; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > limit) out += str(", ... (", items.size(), " in all)");
  return out;
}

bool same_math(const ModelConfig& a, const ModelConfig& b) {
  return a.arch == b.arch && a.vocab_size == b.vocab_size && a.layers == b.layers &&
         a.d_model == b.d_model && a.heads == b.heads &&
         a.head_dim_resolved() == b.head_dim_resolved() &&
         a.shared_expert_ff == b.shared_expert_ff && a.router_scoring == b.router_scoring &&
         a.kv_heads_resolved() == b.kv_heads_resolved() && a.d_ff == b.d_ff &&
         a.experts_per_layer == b.experts_per_layer && a.top_k == b.top_k &&
         a.normalize_topk == b.normalize_topk && a.residual_moe == b.residual_moe &&
         a.norm_eps == b.norm_eps && a.rope_theta == b.rope_theta && a.dtype == b.dtype &&
         a.dense_ff_resolved() == b.dense_ff_resolved() &&
         a.rope_dim_resolved() == b.rope_dim_resolved() && a.qkv_bias == b.qkv_bias &&
         a.qk_norm == b.qk_norm && a.router_groups == b.router_groups &&
         a.router_group_topk == b.router_group_topk && a.routed_scale == b.routed_scale &&
         a.q_lora_rank == b.q_lora_rank && a.kv_lora_rank == b.kv_lora_rank &&
         a.qk_nope_dim == b.qk_nope_dim && a.qk_rope_dim == b.qk_rope_dim &&
         a.v_head_dim == b.v_head_dim && a.sliding_window == b.sliding_window &&
         a.window_layers == b.window_layers && a.tie_embeddings == b.tie_embeddings &&
         a.rope_type == b.rope_type && a.rope_scaling() == b.rope_scaling() &&
         a.attention_scale() == b.attention_scale() && a.swiglu_alpha == b.swiglu_alpha &&
         a.swiglu_limit == b.swiglu_limit;
}

// ---- import_hf, step by step -------------------------------------------------------------------

// Our model config from config.json's fields (the exporter's record may replace it later).
ModelConfig model_config_of(const HfModel& hf, const HfImportOptions& options) {
  ModelConfig mc;
  mc.arch = hf.arch;
  mc.vocab_size = hf.vocab;
  mc.layers = hf.layers;
  mc.d_model = hf.hidden;
  mc.heads = hf.heads;
  mc.kv_heads = hf.kv_heads;
  mc.head_dim = hf.head_dim;
  mc.shared_expert_ff = hf.shared_ff;
  mc.d_ff = hf.ffn;
  mc.experts = hf.experts;
  mc.moe_every = 1;
  mc.experts_per_layer.assign(static_cast<size_t>(std::max<int64_t>(hf.layers, 0)), hf.experts);
  for (int64_t i = 0; i < hf.dense_layers && i < hf.layers; ++i)  // GLM's first_k_dense_replace
    mc.experts_per_layer[static_cast<size_t>(i)] = 0;
  mc.dense_ff = hf.dense_ff == hf.ffn ? 0 : hf.dense_ff;
  mc.rope_dim = hf.rope_dim;
  mc.qkv_bias = hf.qkv_bias;
  mc.qk_norm = hf.qk_norm;
  if (hf.sigmoid_router) mc.router_scoring = nn::RouterScoring::sigmoid;
  mc.router_groups = hf.groups;
  mc.router_group_topk = hf.group_topk;
  mc.routed_scale = hf.routed_scale;
  mc.q_lora_rank = hf.q_lora;
  mc.kv_lora_rank = hf.kv_lora;
  mc.qk_nope_dim = hf.qk_nope;
  mc.qk_rope_dim = hf.qk_rope;
  mc.v_head_dim = hf.v_head;
  mc.top_k = hf.top_k;
  mc.capacity_factor = 0;  // HF MoE layers are dropless
  mc.aux_loss_coef = hf.aux_coef;
  mc.z_loss_coef = 0;  // transformers' MoE models have no router z-loss
  mc.residual_moe = false;
  mc.normalize_topk = hf.normalize;
  mc.router_jitter = hf.jitter;
  mc.norm_eps = hf.eps;
  mc.rope_theta = hf.rope_theta;
  mc.rope_type = hf.rope_type;
  mc.yarn = hf.yarn;
  mc.seq = options.max_seq > 0 ? std::min(hf.max_positions, options.max_seq) : hf.max_positions;
  mc.sliding_window = hf.sliding_window;
  mc.window_layers = hf.window_layers;
  mc.tie_embeddings = hf.tied;
  mc.swiglu_alpha = hf.swiglu_alpha;
  mc.swiglu_limit = hf.swiglu_limit;
  return mc;
}

// Where every source tensor goes.
struct TensorPlan {
  std::vector<LayerSources> layers;
  std::map<std::string, std::string> outer;  // our name -> hf name
  std::vector<std::string> derived;          // checked against the config, not imported
  std::vector<std::string> skipped;          // multi-token-prediction layers, a tied lm_head.weight
};

// Whether `name` belongs to a multi-token-prediction layer: model.layers.<i>. with i in
// [num_hidden_layers, num_hidden_layers + num_nextn_predict_layers).
bool prediction_layer(const std::string& name, const HfModel& hf) {
  const std::string prefix = "model.layers.";
  if (hf.extra_layers == 0 || name.compare(0, prefix.size(), prefix) != 0) return false;
  int64_t layer = 0;
  size_t i = prefix.size();
  for (; i < name.size() && i < prefix.size() + 9 &&
         std::isdigit(static_cast<unsigned char>(name[i]));
       ++i)
    layer = layer * 10 + (name[i] - '0');
  return i > prefix.size() && i < name.size() && name[i] == '.' && layer >= hf.layers &&
         layer < hf.layers + hf.extra_layers;
}

// Sorts every tensor by classify(); unmapped ones go to rep.unmapped, the features unsupported
// ones show to rep.unsupported (one line per feature, naming its first tensor). Throws on two
// tensors for one slot, or a layer or expert index beyond config.json's.
TensorPlan plan_tensors(const std::string& dir, const Sources& sources, const HfModel& hf,
                        const Flavour& flavour, HfImportReport& rep) {
  TensorPlan plan;
  plan.layers.resize(static_cast<size_t>(std::max<int64_t>(hf.layers, 0)));
  std::vector<std::string> features;  // unsupported features the tensors show, first seen first
  std::map<std::string, std::pair<std::string, int>> feature_tensors;  // -> first tensor, count
  auto claim = [&](std::string& slot, const std::string& name, const std::string& what) {
    if (!slot.empty())
      throw Error(str("'", dir, "': tensors '", slot, "' and '", name, "' both give ", what));
    slot = name;
  };
  for (const auto& [name, where] : sources.tensors) {
    if (hf.tied && name == "lm_head.weight") {
      // transformers ties it to the embedding on load (the embedding's values win); so do we
      rep.notes.push_back(
          "lm_head.weight not imported: tie_word_embeddings makes the head the embedding");
      plan.skipped.push_back(name);
      continue;
    }
    if (prediction_layer(name, hf)) {
      // GLM's multi-token-prediction layers (num_nextn_predict_layers): transformers skips them
      add_unique(rep.notes, str("multi-token-prediction layers (", hf.layers, "..",
                                hf.layers + hf.extra_layers - 1,
                                ", num_nextn_predict_layers) skipped: next-token scoring "
                                "does not use them"));
      plan.skipped.push_back(name);
      continue;
    }
    Classified c = classify(name);
    if (c.kind == Classified::unmapped) {
      rep.unmapped.push_back(name);
      continue;
    }
    if (c.kind == Classified::unsupported) {
      auto [it, first] = feature_tensors.emplace(c.feature, std::make_pair(name, 0));
      if (first) features.push_back(c.feature);
      ++it->second.second;
      continue;
    }
    if (c.kind == Classified::derived) {
      plan.derived.push_back(name);
      continue;
    }
    if (c.layer < 0) {
      claim(plan.outer[c.our], name, c.our);
      continue;
    }
    if (c.layer >= hf.layers)
      throw Error(str("'", sources.file_of(name), "': tensor '", name, "' belongs to layer ",
                      c.layer, ", but config.json has num_hidden_layers ", hf.layers));
    if (!hf::flavour_has(flavour, c.slot)) {  // e.g. q_norm in a Mixtral checkpoint
      auto [it, first] = feature_tensors.emplace(hf::slot_feature(c.slot), std::make_pair(name, 0));
      if (first) features.push_back(hf::slot_feature(c.slot));
      ++it->second.second;
      continue;
    }
    LayerSources& ls = plan.layers[static_cast<size_t>(c.layer)];
    const std::string what = str("blocks.", c.layer, ".", slot_name(c.slot));
    if (c.expert < 0) {
      claim(ls.single[c.slot], name, what);
      continue;
    }
    if (c.expert >= hf.experts)
      throw Error(str("'", sources.file_of(name), "': tensor '", name, "' is expert ", c.expert,
                      ", but config.json has ", hf.experts, " experts per layer"));
    auto& names = ls.per_expert[c.slot];
    names.resize(static_cast<size_t>(hf.experts));
    claim(names[static_cast<size_t>(c.expert)], name, str(what, " expert ", c.expert));
  }
  for (const std::string& feature : features) {
    const auto& [example, count] = feature_tensors[feature];
    add_unique(rep.unsupported,
               count == 1 ? str(feature, " (tensor ", example, ")")
                          : str(feature, " (tensor ", example, " and ", count - 1, " more)"));
  }
  return plan;
}

// Refuses a checkpoint that uses features our flavour of its family lacks, or (unless allowed)
// holds tensors we have no place for.
void refuse_unsupported(const std::string& dir, const HfModel& hf, const ModelConfig& mc,
                        const HfImportOptions& options, HfImportReport& rep) {
  if (!rep.unsupported.empty())
    throw Error(str("'", dir, "': the ", hf.family, " checkpoint uses features our ",
                    arch_name(mc.arch),
                    " flavour does not have: ", list_some(rep.unsupported, 16)));
  if (!rep.unmapped.empty() && !options.allow_unmapped)
    throw Error(str("'", dir, "': ", rep.unmapped.size(),
                    " tensors have no counterpart in our model (pass allow_unmapped / ",
                    flag_for(Setting::allow_unmapped),
                    " to import without them): ", list_some(rep.unmapped)));
}

// The storage dtype: the checkpoint's when all mapped tensors share one, else f32. gpt-oss's F32
// norms (transformers' _keep_in_fp32_modules) in an otherwise 16-bit file take its dtype when
// every value is exact in it. MXFP4 blocks (U8) are decoded, whatever the dtype.
DType storage_dtype(const Sources& sources, const TensorPlan& plan, bool gpt_oss,
                    HfImportReport& rep) {
  std::set<std::string> dtypes;
  std::vector<std::string> f32_norms;
  for (const auto& [name, where] : sources.tensors) {
    if (std::find(rep.unmapped.begin(), rep.unmapped.end(), name) != rep.unmapped.end()) continue;
    if (std::find(plan.derived.begin(), plan.derived.end(), name) != plan.derived.end()) continue;
    const Classified c = classify(name);
    // our selection bias and sinks are always f32; MXFP4 blocks and scales are decoded
    if (c.slot == Slot::router_bias || c.slot == Slot::sinks) continue;
    if (gpt_oss && (c.slot == Slot::gate_up_blocks || c.slot == Slot::gate_up_scales ||
                    c.slot == Slot::down_blocks || c.slot == Slot::down_scales))
      continue;
    if (std::find(plan.skipped.begin(), plan.skipped.end(), name) != plan.skipped.end()) continue;
    const std::string& dt = where.second->dtype;
    const bool norm = c.our == "final_norm.weight" ||
                      (c.layer >= 0 && (c.slot == Slot::norm1 || c.slot == Slot::norm2));
    if (gpt_oss && norm && dt == "F32") {
      f32_norms.push_back(name);
      continue;
    }
    if (dt != "F32" && dt != "BF16" && dt != "F16")
      throw Error(str("'", where.first->path(), "': tensor '", name, "' has dtype ", dt,
                      "; parameters must be F32, BF16 or F16"));
    dtypes.insert(dt);
  }
  if (!f32_norms.empty()) {
    DType half = DType::f32;
    if (dtypes.size() == 1 && *dtypes.begin() != "F32" &&
        dtype_from_safetensors(*dtypes.begin(), &half) && hf::exact_in(sources, f32_norms, half))
      rep.notes.push_back(str(f32_norms.size(), " F32 norms (as transformers saves gpt-oss's) ",
                              "stored as ", dtype_name(half), ": every value is exact in it"));
    else
      dtypes.insert("F32");
  }
  DType target = DType::f32;
  if (dtypes.size() == 1) {
    dtype_from_safetensors(*dtypes.begin(), &target);
  } else if (dtypes.size() > 1) {
    rep.notes.push_back(str("mixed storage dtypes (",
                            list_some(std::vector<std::string>(dtypes.begin(), dtypes.end())),
                            "): every parameter converted to f32 (exact)"));
  }
  return target;
}

// A file our export_hf wrote records our exact model config: taken when it agrees with
// config.json. Then the config is resolved (a model we cannot build is refused here).
void adopt_recorded_config(const Sources& sources, const HfModel& hf,
                           const std::string& config_path, ModelConfig& mc, HfImportReport& rep) {
  auto meta = sources.metadata.find(kMetadataConfig);
  if (meta != sources.metadata.end()) {
    try {
      ModelConfig recorded = model_config_from_json(json::parse(meta->second));
      if (same_math(recorded, mc)) {
        const int64_t capped = mc.seq;  // min(max_position_embeddings, max_seq)
        mc = recorded;
        rep.notes.push_back("model config taken from the exporter's record (moe.model_config)");
        if (capped < mc.seq) {  // max_seq caps the record's context too
          rep.notes.push_back(
              str("context (seq) capped at ", capped, " of the recorded ", mc.seq, " (max_seq)"));
          mc.seq = capped;
        }
      } else {
        rep.notes.push_back("moe.model_config metadata disagrees with config.json: ignored");
      }
    } catch (const std::exception& e) {
      rep.notes.push_back(str("moe.model_config metadata unreadable (", e.what(), "): ignored"));
    }
  } else if (mc.seq < hf.max_positions) {
    rep.notes.push_back(
        str("context (seq) capped at ", mc.seq, " of max_position_embeddings ", hf.max_positions));
  }
  try {
    mc.resolve();
  } catch (const Error& e) {
    throw Error(str("'", config_path, "': not a model we can build: ", e.what()));
  }
}

// Reads source tensors with the shape the config implies, in the storage dtype, and builds the
// checkpoint's parameters in our order, recording each mapping in the report.
// The parameters are deferred (NamedTensor::deferred, experts streamed one at a time): shapes are
// checked here, values read (converted, checked finite) only when the checkpoint is written, so
// a model of any size imports in the memory of its largest tensor.
struct Importer {
  Importer(const std::string& dir, std::shared_ptr<const Sources> shared, const ModelConfig& mc,
           DType target, int64_t experts, HfImportReport& rep)
      : dir(dir),
        shared(std::move(shared)),
        sources(*this->shared),
        mc(mc),
        target(target),
        rep(rep),
        E(experts) {}

  const std::string& dir;
  const std::shared_ptr<const Sources> shared;  // kept alive by the deferred reads
  const Sources& sources;
  const ModelConfig& mc;
  const DType target;
  HfImportReport& rep;
  Checkpoint ckpt;  // parameters added in our order
  // Shape letters (see the top of the file).
  const int64_t V = mc.vocab_size, D = mc.d_model, F = mc.d_ff, E;
  const int64_t hd = mc.head_dim_resolved(), KV = mc.kv_heads_resolved();
  const int64_t Fs = mc.shared_expert_ff;
  const Flavour flavour = flavour_of(mc);
  bool rope_interleave = true;    // DeepSeek's RoPE rows in pairs (HfModel::rope_interleave)
  bool keep_mxfp4 = false;        // HfImportOptions::keep_mxfp4
  json formats = json::object();  // tensor_formats of the params kept in blocks

  void check_shape(const std::string& name, const Shape& expected, const std::string& why) const {
    const SafetensorsEntry& e = sources.entry(name);
    if (e.shape != expected)
      throw Error(str("'", sources.file_of(name), "': tensor '", name, "' is ", shape_str(e.shape),
                      ", but config.json implies ", shape_str(expected), " (", why, ")"));
  }
  // A source tensor (or rows of it) in the storage dtype, refused when it holds NaN/Inf.
  // `offset`: where the part read starts in the expert's slice (a fused expert's up half).
  static Tensor converted(const Sources& s, const std::string& name, Tensor t, DType target,
                          int64_t expert = -1, const Shape& whole = {}, int64_t offset = 0) {
    t = t.dtype() == target ? t : t.to(target);
    const std::string where = str("'", s.file_of(name), "'");
    if (expert < 0)
      check_finite(where, name, t);
    else
      check_finite_expert(where, name, t, expert, whole, offset);
    return t;
  }
  Tensor fetch(const std::string& name, const Shape& expected, const std::string& why) const {
    check_shape(name, expected, why);
    return converted(sources, name, sources.read(name), target);
  }
  // The same, read when the checkpoint is written.
  NamedTensor deferred(const std::string& our, const std::string& name, const Shape& expected,
                       const std::string& why) const {
    check_shape(name, expected, why);
    auto source = std::make_shared<TensorSource>();
    source->shape = expected;
    source->dtype = target;
    source->read = [s = shared, name, target = target] {
      return converted(*s, name, s->read(name), target);
    };
    NamedTensor nt{our, Tensor(), false, {}};
    nt.deferred = std::move(source);
    return nt;
  }
  // An expert tensor [E, ...rest] read one expert at a time: read(e) gives expert e's slice.
  void add_experts(const std::string& our, const Shape& shape,
                   std::function<Tensor(const Sources&, int64_t)> read,
                   std::optional<DType> dtype = std::nullopt) {
    auto source = std::make_shared<ExpertSource>();
    source->shape = shape;
    source->dtype = dtype.value_or(target);
    source->read = [s = shared, read = std::move(read)](int64_t e) { return read(*s, e); };
    ckpt.params.push_back(NamedTensor{our, Tensor(), true, {}, std::move(source)});
  }
  const std::string& need(const std::string& hf_name, const std::string& what) const {
    if (hf_name.empty())
      throw Error(str("'", dir, "': no tensor for ", what, " (the checkpoint is incomplete)"));
    return hf_name;
  }
  // RoPE frequencies some checkpoints store: they must be what rope_theta (and YaRN) give.
  void check_rope(const std::vector<std::string>& derived) {
    const int64_t rd = mc.rope_dim_resolved();  // head_dim, or the rotated part of it (GLM)
    const ops::RopeScaling yarn = derived.empty() ? ops::RopeScaling{} : mc.rope_scaling();
    for (const std::string& name : derived) {
      Tensor t =
          fetch(name, {rd / 2}, "RoPE inverse frequencies [rotated dims / 2]").to(DType::f32);
      const float* f = t.data<float>();
      for (int64_t i = 0; i < rd / 2; ++i) {
        const double trained = 1.0 / std::pow(mc.rope_theta, 2.0 * double(i) / double(rd));
        const double r = std::clamp((double(i) - yarn.ramp_low) / yarn.ramp_width, 0.0, 1.0);
        const double want = trained * (1.0 - r) + trained / yarn.factor * r;  // YaRN's blend
        if (std::abs(f[i] - want) > 1e-3 * want)
          throw Error(str("'", sources.file_of(name), "': tensor '", name, "' element ", i, " is ",
                          f[i], ", but rope_theta ", mc.rope_theta, " gives ", want,
                          " (unsupported RoPE variant)"));
      }
      rep.mapped.push_back(str(name, " -> (derived from rope_theta; checked)"));
    }
  }

  // An outer tensor (embedding, final norm, LM head) under our name `our`.
  void outer(TensorPlan& plan, const std::string& our, const std::string& what, const Shape& shape,
             const std::string& why) {
    ckpt.params.push_back(deferred(our, need(plan.outer[our], what), shape, why));
    rep.mapped.push_back(str(plan.outer[our], " -> ", our));
  }

  // The tensor of `slot` in the block under `prefix`, as our parameter.
  void take(const std::string& prefix, LayerSources& ls, Slot slot, const Shape& shape,
            const std::string& why) {
    const std::string our = prefix + slot_name(slot);
    const std::string& name = need(ls.single[slot], our);
    ckpt.params.push_back(deferred(our, name, shape, why));
    rep.mapped.push_back(str(name, " -> ", our));
  }

  // q/k/v/o with their biases and qk-norm as the flavour has them.
  void attention(const std::string& prefix, LayerSources& ls) {
    auto single = [&](Slot slot, const Shape& shape, const std::string& why) {
      take(prefix, ls, slot, shape, why);
    };
    single(Slot::q, {mc.heads * hd, D}, "[num_attention_heads * head_dim, hidden_size]");
    single(Slot::k, {KV * hd, D}, "[num_key_value_heads * head_dim, hidden_size]");
    single(Slot::v, {KV * hd, D}, "[num_key_value_heads * head_dim, hidden_size]");
    single(Slot::o, {D, mc.heads * hd}, "[hidden_size, num_attention_heads * head_dim]");
    if (flavour.qkv_bias || flavour.bias) {
      single(Slot::q_bias, {mc.heads * hd}, "[num_attention_heads * head_dim]");
      single(Slot::k_bias, {KV * hd}, "[num_key_value_heads * head_dim]");
      single(Slot::v_bias, {KV * hd}, "[num_key_value_heads * head_dim]");
    }
    if (flavour.bias) single(Slot::o_bias, {D}, "[hidden_size]");
    if (flavour.sinks) take_f32(prefix, ls, Slot::sinks, {mc.heads}, "[num_attention_heads]");
    if (flavour.qk_norm == nn::QkNorm::head) {
      single(Slot::q_norm, {hd}, "[head_dim]: one RMSNorm weight shared by the heads");
      single(Slot::k_norm, {hd}, "[head_dim]: one RMSNorm weight shared by the heads");
    } else if (flavour.qk_norm == nn::QkNorm::full) {
      single(Slot::q_norm, {mc.heads * hd}, "[num_attention_heads * head_dim]");
      single(Slot::k_norm, {KV * hd}, "[num_key_value_heads * head_dim]");
    }
  }

  // DeepSeek-V3's latent attention: each of our params rows of an HF tensor (io/hf_mla.h).
  void latent_attention(const std::string& prefix, LayerSources& ls) {
    for (Slot unused : {Slot::k, Slot::v})
      if (!ls.single[unused].empty())
        throw Error(str("'", sources.file_of(ls.single[unused]), "': tensor '", ls.single[unused],
                        "' has no place in DeepSeek's latent attention"));
    for (const hf::MlaPart& part : hf::mla_parts(mc, rope_interleave)) {
      const std::string our = prefix + part.our;
      const std::string& name = need(ls.single[part.slot], our);
      std::string why;
      const Shape whole = hf::mla_hf_shape(mc, part.slot, why);
      check_shape(name, whole, why);
      Shape shape = whole;
      shape[0] = static_cast<int64_t>(part.rows.size());
      auto source = std::make_shared<TensorSource>();
      source->shape = shape;
      source->dtype = target;
      source->read = [s = shared, name, target = target, rows = part.rows] {
        return hf::pick_rows(converted(*s, name, s->read(name), target), rows);
      };
      NamedTensor nt{our, Tensor(), false, {}};
      nt.deferred = std::move(source);
      ckpt.params.push_back(std::move(nt));
      rep.mapped.push_back(str(name, " -> ", our));
    }
  }

  // Block i: norms, attention, router, then the experts (fused or one tensor per expert).
  void layer(int64_t i, LayerSources& ls) {
    const std::string prefix = str("blocks.", i, ".");
    auto single = [&](Slot slot, const Shape& shape, const std::string& why) {
      take(prefix, ls, slot, shape, why);
    };
    single(Slot::norm1, {D}, "[hidden_size]");
    single(Slot::norm2, {D}, "[hidden_size]");
    if (flavour.latent_attention)
      latent_attention(prefix, ls);
    else
      attention(prefix, ls);
    if (!mc.is_moe_layer(i)) {
      dense_mlp(prefix, ls);
      return;
    }
    single(Slot::router, {E, D}, "[experts, hidden_size]");
    if (flavour.router_bias) take_f32(prefix, ls, Slot::router_bias, {E}, "[n_routed_experts]");
    if (flavour.router_logit_bias) single(Slot::router_logit_bias, {E}, "[num_local_experts]");
    if (mc.arch == Arch::gpt_oss) {  // its own fused layout (io/hf_gpt_oss.h)
      if (!ls.per_expert.empty())
        throw Error(str("'", dir, "': layer ", i, " has per-expert tensors; gpt-oss's experts ",
                        "are fused (mlp.experts.gate_up_proj, down_proj)"));
      for (hf::ExpertPart& part : hf::gpt_oss_experts(sources, ls.single, prefix, E, D, F, target,
                                                      keep_mxfp4, rep.mapped)) {
        if (part.mxfp4) formats[part.our] = "mxfp4";
        add_experts(part.our, part.shape, std::move(part.read), part.dtype);
      }
      return;
    }

    const bool fused = !ls.single[Slot::gate_up].empty() || !ls.single[Slot::down].empty();
    const bool split = !ls.per_expert.empty();
    if (fused && split)
      throw Error(str("'", dir, "': layer ", i,
                      " has both per-expert and fused (gate_up_proj/down_proj) expert tensors"));
    if (fused)
      fused_experts(prefix, ls);
    else
      per_expert(prefix, ls);
    if (flavour.shared_expert_gate) shared_expert(prefix, ls);
    if (flavour.ungated_shared_expert && Fs > 0) {
      take(prefix, ls, Slot::shared_w1, {Fs, D},
           "[n_shared_experts * moe_intermediate_size, hidden_size]");
      take(prefix, ls, Slot::shared_w2, {D, Fs},
           "[hidden_size, n_shared_experts * moe_intermediate_size]");
      take(prefix, ls, Slot::shared_w3, {Fs, D},
           "[n_shared_experts * moe_intermediate_size, hidden_size]");
    }
  }

  // A dense layer's MLP (GLM-4-MoE's first_k_dense_replace layers, intermediate_size wide).
  void dense_mlp(const std::string& prefix, LayerSources& ls) {
    const int64_t Fd = mc.dense_ff_resolved();
    take(prefix, ls, Slot::dense_w1, {Fd, D}, "[intermediate_size, hidden_size]");
    take(prefix, ls, Slot::dense_w2, {D, Fd}, "[hidden_size, intermediate_size]");
    take(prefix, ls, Slot::dense_w3, {Fd, D}, "[intermediate_size, hidden_size]");
  }

  // A param kept in f32 whatever the model's dtype (our layers store them so): the router's
  // selection bias (e_score_correction_bias [E]), gpt-oss's sinks [H].
  void take_f32(const std::string& prefix, LayerSources& ls, Slot slot, const Shape& shape,
                const std::string& why) {
    const std::string our = prefix + slot_name(slot);
    const std::string& name = need(ls.single[slot], our);
    check_shape(name, shape, why);
    auto source = std::make_shared<TensorSource>();
    source->shape = shape;
    source->dtype = DType::f32;
    source->read = [s = shared, name] { return converted(*s, name, s->read(name), DType::f32); };
    NamedTensor nt{our, Tensor(), false, {}};
    nt.deferred = std::move(source);
    ckpt.params.push_back(std::move(nt));
    rep.mapped.push_back(str(name, " -> ", our));
  }

  // Qwen2-MoE's shared expert (an MLP of width Fs) and its sigmoid gate [1, D]. transformers
  // creates them even when Fs is 0; then they are empty and the gate scales nothing: checked and
  // left out (our model has no shared expert then).
  void shared_expert(const std::string& prefix, LayerSources& ls) {
    const char* why_up = "[shared_expert_intermediate_size, hidden_size]";
    const char* why_down = "[hidden_size, shared_expert_intermediate_size]";
    if (Fs == 0) {
      for (auto [slot, shape] : {std::pair<Slot, Shape>{Slot::shared_w1, {0, D}},
                                 {Slot::shared_w2, {D, 0}},
                                 {Slot::shared_w3, {0, D}},
                                 {Slot::shared_gate, {1, D}}}) {
        const std::string& name = ls.single[slot];
        if (name.empty()) continue;  // a writer that leaves the empty ones out: nothing lost
        const SafetensorsEntry& e = sources.entry(name);
        if (e.shape != shape)
          throw Error(str("'", sources.file_of(name), "': tensor '", name, "' is ",
                          shape_str(e.shape), ", but config.json implies ", shape_str(shape),
                          " (shared_expert_intermediate_size 0)"));
        rep.mapped.push_back(str(name, " -> (none: the shared expert is 0 wide; left out)"));
      }
      return;
    }
    take(prefix, ls, Slot::shared_w1, {Fs, D}, why_up);
    take(prefix, ls, Slot::shared_w2, {D, Fs}, why_down);
    take(prefix, ls, Slot::shared_w3, {Fs, D}, why_up);
    take(prefix, ls, Slot::shared_gate, {1, D}, "[1, hidden_size]");
  }

  // gate_up_proj [E, 2F, D]: per expert the gate (w1) rows, then the up (w3) rows, each a linear
  // weight [out, in] (transformers' concatenated, not transposed, layout).
  void fused_experts(const std::string& prefix, LayerSources& ls) {
    const std::string gu =
        need(ls.single[Slot::gate_up], prefix + "moe.experts.w1/w3 (gate_up_proj)");
    const std::string dn = need(ls.single[Slot::down], prefix + "moe.experts.w2 (down_proj)");
    check_shape(gu, {E, 2 * F, D},
                "[experts, 2 * intermediate, hidden_size]: gate rows then up rows");
    check_shape(dn, {E, D, F}, "[experts, hidden_size, intermediate]");
    const Shape whole_gu{E, 2 * F, D}, whole_dn{E, D, F};
    const DType t = target;
    const int64_t Fe = F;
    // 0: the gate rows (w1), 1: the up rows (w3) of expert e, each read alone (the half's bytes).
    auto half = [gu, whole_gu, t, Fe](int64_t which) {
      return [=](const Sources& s, int64_t e) {
        const int64_t D = whole_gu[2], offset = which * Fe * D;
        return converted(s, gu, s.read_elements(gu, e * 2 * Fe * D + offset, {Fe, D}), t, e,
                         whole_gu, offset);
      };
    };
    add_experts(prefix + "moe.experts.w1", {E, F, D}, half(0));
    add_experts(prefix + "moe.experts.w2", {E, D, F},
                [dn, whole_dn, t](const Sources& s, int64_t e) {
                  return converted(s, dn, s.read_rows(dn, e, e + 1), t, e, whole_dn);
                });
    add_experts(prefix + "moe.experts.w3", {E, F, D}, half(1));
    rep.mapped.push_back(str(gu, " -> ", prefix, "moe.experts.w1 (rows 0..F-1 of each expert), ",
                             prefix, "moe.experts.w3 (rows F..2F-1)"));
    rep.mapped.push_back(str(dn, " -> ", prefix, "moe.experts.w2"));
  }

  // One tensor per expert (w1/w2/w3 or gate_proj/down_proj/up_proj), stacked in expert order.
  void per_expert(const std::string& prefix, LayerSources& ls) {
    auto gather = [&](Slot slot, const Shape& shape, const std::string& why) {
      auto& names = ls.per_expert[slot];
      names.resize(static_cast<size_t>(E));
      const std::string our = str(prefix, slot_name(slot));
      for (int64_t e = 0; e < E; ++e) {
        const std::string& name = need(names[static_cast<size_t>(e)], str(our, " expert ", e));
        check_shape(name, shape, why);
        rep.mapped.push_back(str(name, " -> ", our, " expert ", e));
      }
      Shape whole = shape;
      whole.insert(whole.begin(), E);
      add_experts(our, whole, [names, t = target](const Sources& s, int64_t e) {
        const std::string& name = names[static_cast<size_t>(e)];
        return converted(s, name, s.read(name), t);
      });
    };
    gather(Slot::w1, {F, D}, "[intermediate, hidden_size]");
    gather(Slot::w2, {D, F}, "[hidden_size, intermediate]");
    gather(Slot::w3, {F, D}, "[intermediate, hidden_size]");
  }
};

}  // namespace

Checkpoint import_hf(const std::string& dir, bool allow_unmapped, HfImportReport* report) {
  HfImportOptions options;
  options.allow_unmapped = allow_unmapped;
  return import_hf(dir, options, report);
}

namespace {

// The directory's tokenizer (tokenizer.model preferred, else tokenizer.json), kept verbatim when
// we can run it; one we cannot (another model type, normaliser, ...) is left out with a note, as
// the model itself still scores token files. A tokenizer with more tokens than the model's
// vocabulary would give ids the model has no row for: left out too, with a note.
StoredTokenizer import_tokenizer(const std::string& dir, int64_t vocab, HfImportReport& rep) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / kTokenizerModel, ec) &&
      !fs::exists(fs::path(dir) / kTokenizerJson, ec))
    return {};
  try {
    const std::unique_ptr<Tokenizer> tok = load_tokenizer(dir);
    if (tok->vocab_size() > vocab) {
      rep.notes.push_back(str("tokenizer left out: ", tok->describe(), " has more tokens than the ",
                              "model's vocabulary (", vocab, ")"));
      return {};
    }
    rep.notes.push_back(str("tokenizer kept: ", tok->describe()));
    return {tok->file_name(), tok->file_bytes()};
  } catch (const Error& e) {
    rep.notes.push_back(str("tokenizer left out: ", e.what()));
    return {};
  }
}

}  // namespace

ModelConfig hf_model_config(const std::string& path, const HfImportOptions& options) {
  std::error_code ec;
  const std::string config_path = fs::is_directory(path, ec) ? join_path(path, kConfigFile) : path;
  if (!path_exists(config_path)) throw Error(str("'", path, "': no config.json"));
  const json j = read_json_file(config_path);
  std::vector<std::string> unsupported;
  const HfModel hf = parse_config(j, config_path, unsupported);
  ModelConfig mc = model_config_of(hf, options);
  if (!unsupported.empty())
    throw Error(str("'", config_path, "': the ", hf.family, " model uses features our ",
                    arch_name(mc.arch), " flavour does not have: ", list_some(unsupported, 16)));
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!j.contains(key) || !j[key].is_string()) continue;
    const std::string name = j[key].get<std::string>();
    mc.dtype = name == "bfloat16" ? DType::bf16 : name == "float16" ? DType::f16 : DType::f32;
  }
  try {
    mc.resolve();
  } catch (const Error& e) {
    throw Error(str("'", config_path, "': not a model we can build: ", e.what()));
  }
  return mc;
}

Checkpoint import_hf(const std::string& dir, const HfImportOptions& options,
                     HfImportReport* report) {
  HfImportReport local;
  HfImportReport& rep = report ? *report : local;
  rep = HfImportReport{};
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(str("'", dir,
                    "': not a directory (import-hf reads a Hugging Face checkpoint "
                    "directory: config.json + safetensors)"));
  const std::string config_path = join_path(dir, kConfigFile);
  if (!path_exists(config_path)) throw Error(str("'", dir, "': no config.json"));
  const json hf_config = read_json_file(config_path);
  HfModel hf = parse_config(hf_config, config_path, rep.unsupported);
  rep.family = hf.family;
  auto shared_sources = std::make_shared<const Sources>(open_sources(dir));
  const Sources& sources = *shared_sources;

  ModelConfig mc = model_config_of(hf, options);
  TensorPlan plan = plan_tensors(dir, sources, hf, flavour_of(mc), rep);
  refuse_unsupported(dir, hf, mc, options, rep);
  const DType target = storage_dtype(sources, plan, mc.arch == Arch::gpt_oss, rep);
  mc.dtype = target;
  adopt_recorded_config(sources, hf, config_path, mc, rep);

  Importer in(dir, shared_sources, mc, target, hf.experts, rep);
  in.rope_interleave = hf.rope_interleave;
  in.keep_mxfp4 = options.keep_mxfp4;
  in.check_rope(plan.derived);
  const std::string why_vd = "[vocab_size, hidden_size]";
  in.outer(plan, "embed.tokens", "the token embedding", {in.V, in.D}, why_vd);
  for (int64_t i = 0; i < mc.layers; ++i) in.layer(i, plan.layers[static_cast<size_t>(i)]);
  in.outer(plan, "final_norm.weight", "the final norm", {in.D}, "[hidden_size]");
  if (!mc.tie_embeddings)
    in.outer(plan, "lm_head.weight", "the LM head (lm_head.weight)", {in.V, in.D}, why_vd);

  Checkpoint ckpt = std::move(in.ckpt);
  ckpt.model_config = to_json(mc);
  if (!in.formats.empty()) {  // gpt-oss's MXFP4 experts kept (keep_mxfp4), as import-gguf does
    ckpt.model_config[kQuantizationKey] = "mxfp4";
    ckpt.model_config[kTensorFormatsKey] = in.formats;
  } else if (options.keep_mxfp4) {
    rep.notes.push_back("keep_mxfp4: no MXFP4 experts in this checkpoint, nothing kept");
  }
  ckpt.train_config = nullptr;
  ckpt.provenance = options.provenance;
  if (ckpt.provenance.tool.empty())
    ckpt.provenance =
        Provenance{"libmoe import_hf", version(), git_revision(), "", utc_timestamp()};
  if (ckpt.provenance.time.empty()) ckpt.provenance.time = utc_timestamp();
  ckpt.tokenizer = import_tokenizer(dir, mc.vocab_size, rep);
  return ckpt;
}

}  // namespace moe::io
