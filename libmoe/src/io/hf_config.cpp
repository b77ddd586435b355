// config.json of a Hugging Face MoE checkpoint (see io/hf_config.h and docs/FORMATS.md).
#include "io/hf_config.h"

#include "io/hf_names.h"
#include "moe/error.h"
#include "moe/models/flavour.h"
#include "moe/ops/moe.h"

namespace moe::io::hf {

namespace {

using nlohmann::json;

struct ConfigReader {
  const json& j;
  std::string path;

  bool has(const std::string& key) const { return j.contains(key) && !j[key].is_null(); }
  int64_t integer(const std::string& key) const {
    if (!has(key)) throw Error(str("'", path, "': missing \"", key, "\""));
    if (!j[key].is_number_integer())
      throw Error(str("'", path, "': \"", key, "\" is not an integer (", j[key].dump(), ")"));
    return j[key].get<int64_t>();
  }
  int64_t integer_or(const std::string& key, int64_t fallback) const {
    return has(key) ? integer(key) : fallback;
  }
  double number_or(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_number())
      throw Error(str("'", path, "': \"", key, "\" is not a number (", j[key].dump(), ")"));
    return j[key].get<double>();
  }
  bool boolean_or(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_boolean())
      throw Error(str("'", path, "': \"", key, "\" is not true/false (", j[key].dump(), ")"));
    return j[key].get<bool>();
  }
  std::string string_or(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_string())
      throw Error(str("'", path, "': \"", key, "\" is not a string (", j[key].dump(), ")"));
    return j[key].get<std::string>();
  }
};

// The number of experts: configs spell it num_local_experts (Mixtral; Qwen3-MoE as transformers
// 5 writes it) or num_experts (Qwen2-MoE, OLMoE; Qwen3-MoE as 4.x wrote it), and transformers
// reads either spelling for each of these families. Returns the key present ("" if none).
std::string experts_key(const ConfigReader& c, bool mixtral) {
  if (c.has("n_routed_experts")) return "n_routed_experts";  // GLM-4-MoE (DeepSeek-V3's name)
  const bool local = c.has("num_local_experts"), plain = c.has("num_experts");
  if (local && plain && c.integer("num_local_experts") != c.integer("num_experts"))
    throw Error(str("'", c.path, "': \"num_local_experts\" (", c.integer("num_local_experts"),
                    ") and \"num_experts\" (", c.integer("num_experts"),
                    ") disagree; they name the same number"));
  if (local) return "num_local_experts";
  if (plain) return "num_experts";
  throw Error(str("'", c.path, "': missing \"", mixtral ? "num_local_experts" : "num_experts",
                  "\" (the number of experts; \"", mixtral ? "num_experts" : "num_local_experts",
                  "\" is read too)"));
}

// The layers config.json's layer_types marks "sliding_attention" (the others must be
// "full_attention"); the list must name every layer.
std::vector<int64_t> sliding_layer_types(const ConfigReader& c, const HfModel& m,
                                         std::vector<std::string>& unsupported) {
  const json& types = c.j["layer_types"];
  if (!types.is_array() || static_cast<int64_t>(types.size()) != m.layers)
    throw Error(str("'", c.path, "': \"layer_types\" must list num_hidden_layers (", m.layers,
                    ") layer types"));
  std::vector<int64_t> layers;
  for (size_t i = 0; i < types.size(); ++i) {
    const std::string type = types[i].is_string() ? types[i].get<std::string>() : types[i].dump();
    if (type == "sliding_attention")
      layers.push_back(static_cast<int64_t>(i));
    else if (type != "full_attention")
      unsupported.push_back(str("layer type '", type, "' (layer_types)"));
  }
  return layers;
}

// The sliding window as transformers 5.25 applies it (each query sees the last sliding_window
// positions, itself included: masking_utils.sliding_window_overlay):
// - Mixtral: sliding_window (null: none) on every layer;
// - Qwen3-MoE: sliding_window on every layer when use_sliding_window, else none;
// - Qwen2-MoE: when use_sliding_window, on the layers layer_types marks "sliding_attention"; a
//   config without layer_types slides layers i with i even and i < max_window_layers (default
//   28), as Qwen2MoeConfig fills it in. Without use_sliding_window transformers sets the window to
//   0, which no layer may then use.
// OLMoE's, GLM-4-MoE's and DeepSeek's classes have none: a sliding_window key there is ignored, as
// transformers ignores it.
void parse_window(const ConfigReader& c, HfModel& m, std::vector<std::string>& unsupported) {
  const bool qwen2 = m.arch == Arch::qwen2_moe, qwen3 = m.arch == Arch::qwen3_moe;
  if (m.arch != Arch::mixtral && !qwen2 && !qwen3) return;
  const bool on =
      m.arch == Arch::mixtral ? c.has("sliding_window") : c.boolean_or("use_sliding_window", false);
  int64_t window = on ? c.integer_or("sliding_window", 4096) : 0;  // Qwen's default: 4096
  if (on && window < 1)
    throw Error(str("'", c.path, "': \"sliding_window\" is ", window, ": it must be >= 1"));
  std::vector<int64_t> layers;  // the sliding ones
  if (qwen2 && c.has("layer_types")) {
    layers = sliding_layer_types(c, m, unsupported);
    if (!on && !layers.empty())
      unsupported.push_back(str("layer_types sliding ", layers.size(),
                                " layers with use_sliding_window false (transformers' window is "
                                "then 0)"));
  } else if (qwen2 && on) {
    const int64_t below = c.integer_or("max_window_layers", 28);
    for (int64_t i = 0; i < m.layers && i < below; i += 2) layers.push_back(i);
  } else if (on) {
    for (int64_t i = 0; i < m.layers; ++i) layers.push_back(i);
  }
  if (!on || layers.empty()) return;  // no layer slides: full attention everywhere
  m.sliding_window = window;
  if (static_cast<int64_t>(layers.size()) < m.layers) m.window_layers = layers;
}

// YaRN (rope_type "yarn": DeepSeek-V2/V3, gpt-oss, long-context Qwen) as transformers 5.25 reads
// it (standardize_rope_params, then _compute_yarn_parameters): "factor" required; the original
// context from a top-level original_max_position_embeddings first, else the dict's, else
// max_position_embeddings; beta_fast / beta_slow absent, null or 0 mean 32 / 1; mscale,
// mscale_all_dim and attention_factor absent mean derived (0); truncate defaults to true.
// `r` reads the dict, `c` the whole config.
void parse_yarn(const ConfigReader& r, const ConfigReader& c, HfModel& m) {
  const std::string original = "original_max_position_embeddings";
  if (!r.has("factor")) throw Error(str("'", r.path, "': YaRN needs \"factor\""));
  ops::YarnSettings& y = m.yarn;
  y.factor = r.number_or("factor", 1.0);
  y.original_ctx = c.has(original)   ? c.number_or(original, 0.0)
                   : r.has(original) ? r.number_or(original, 0.0)
                                     : static_cast<double>(m.max_positions);
  y.beta_fast = r.number_or("beta_fast", 0.0);
  y.beta_slow = r.number_or("beta_slow", 0.0);
  if (y.beta_fast == 0) y.beta_fast = 32;
  if (y.beta_slow == 0) y.beta_slow = 1;
  y.mscale = r.number_or("mscale", 0.0);
  y.mscale_all_dim = r.number_or("mscale_all_dim", 0.0);
  y.attention_factor = r.number_or("attention_factor", 0.0);
  y.truncate = r.boolean_or("truncate", true);
  m.rope_type = RopeType::yarn;
}

// The MoE layers GLM-4-MoE shares with DeepSeek-V3 (the same keys, defaults per family): a
// sigmoid router with a selection bias, groups and a scale, shared experts, the first layers
// dense, multi-token-prediction layers after the last.
struct MoeDefaults {
  int64_t dense_layers, groups, group_topk;
  double scale;
  int64_t shared = 1;
  bool softmax = false;  // DeepSeek-V2: softmax scores, no selection bias, no renormalisation
};

// DeepSeek-V2's router as transformers' DeepseekV2TopkRouter runs it: softmax over the experts,
// the top-k chosen ("greedy"), their probabilities times routed_scaling_factor, never renormalised.
void parse_v2_router(const ConfigReader& c, HfModel& m, std::vector<std::string>& unsupported) {
  m.normalize = false;
  if (c.boolean_or("norm_topk_prob", false))
    unsupported.push_back("norm_topk_prob true (transformers' DeepSeek-V2 never renormalises)");
  const std::string method = c.string_or("topk_method", "greedy");
  if (method == "group_limited_greedy" && m.group_topk < m.groups)
    unsupported.push_back(str("topk_method 'group_limited_greedy' choosing ", m.group_topk, " of ",
                              m.groups,
                              " groups (its groups score by their best expert; ours by "
                              "their two best)"));
  else if (method != "greedy" && method != "group_limited_greedy")
    unsupported.push_back(str("topk_method '", method, "'"));
  m.groups = m.group_topk = 1;  // greedy, or every group taking part: no group limit
}

void parse_deepseek_moe(const ConfigReader& c, HfModel& m, std::vector<std::string>& unsupported,
                        const MoeDefaults& d) {
  m.sigmoid_router = !d.softmax;
  m.dense_ff = c.integer("intermediate_size");
  m.dense_layers = c.integer_or("first_k_dense_replace", d.dense_layers);
  if (m.dense_layers < 0 || m.dense_layers > m.layers)
    throw Error(str("'", c.path, "': \"first_k_dense_replace\" is ", m.dense_layers,
                    ": it must be between 0 and num_hidden_layers (", m.layers, ")"));
  const int64_t shared = c.integer_or("n_shared_experts", d.shared);
  if (shared < 0 || shared > (int64_t(1) << 16))
    throw Error(str("'", c.path, "': \"n_shared_experts\" must be between 0 and 65536"));
  m.shared_ff = shared * m.ffn;
  m.groups = c.integer_or("n_group", d.groups);
  m.group_topk = c.integer_or("topk_group", d.group_topk);
  if (m.groups < 1 || m.groups > ops::kMaxRouterGroups || m.group_topk < 1 ||
      m.group_topk > m.groups)
    unsupported.push_back(str("n_group ", m.groups, " with topk_group ", m.group_topk,
                              " (we route within 1..", ops::kMaxRouterGroups,
                              " groups, choosing 1..n_group of them)"));
  m.routed_scale = c.number_or("routed_scaling_factor", d.scale);
  m.extra_layers = c.integer_or("num_nextn_predict_layers", 0);
  if (m.extra_layers < 0 || m.extra_layers > 64)
    throw Error(str("'", c.path, "': \"num_nextn_predict_layers\" must be between 0 and 64"));
  if (d.softmax) {
    parse_v2_router(c, m, unsupported);
    return;
  }
  if (c.string_or("topk_method", "noaux_tc") != "noaux_tc")
    unsupported.push_back(str("topk_method '", c.string_or("topk_method", ""), "'"));
  if (c.string_or("scoring_func", "sigmoid") != "sigmoid")
    unsupported.push_back(str("scoring_func '", c.string_or("scoring_func", ""), "'"));
}

// GLM-4-MoE's own keys (configuration_glm4_moe.py), after the ones every family shares.
void parse_glm(const ConfigReader& c, HfModel& m, std::vector<std::string>& unsupported) {
  const json& j = c.j;
  const int64_t hd = m.head_dim > 0 ? m.head_dim : m.hidden / std::max<int64_t>(m.heads, 1);
  // partial_rotary_factor: top level (4.x) or in rope_parameters (5.x); transformers rotates
  // int(head_dim * factor) features of each head.
  double factor = c.number_or("partial_rotary_factor", 0.5);
  if (m.rope_dim == -1) {
    const json& f = j["rope_parameters"]["partial_rotary_factor"];
    if (!f.is_number())
      throw Error(str("'", c.path, "': \"rope_parameters\" partial_rotary_factor is not a number (",
                      f.dump(), ")"));
    factor = f.get<double>();
  }
  if (!(factor > 0 && factor <= 1))
    throw Error(
        str("'", c.path, "': \"partial_rotary_factor\" must be in (0, 1] (got ", factor, ")"));
  m.rope_dim = static_cast<int64_t>(static_cast<double>(hd) * factor);
  if (m.rope_dim % 2 != 0 || m.rope_dim < 2)
    unsupported.push_back(str("partial_rotary_factor ", factor, " of head_dim ", hd,
                              " (rotates an odd or zero number of features)"));
  if (m.rope_dim == hd) m.rope_dim = 0;
  m.qkv_bias = c.boolean_or("attention_bias", false);  // q/k/v only: o_proj has none here
  m.qk_norm = c.boolean_or("use_qk_norm", false);
  parse_deepseek_moe(c, m, unsupported, MoeDefaults{1, 1, 1, 1.0});
}

// DeepSeek-V3's own keys (configuration_deepseek_v3.py; DeepSeek-V2's, configuration_deepseek_v2,
// are the same with V2's defaults and router): Multi-head Latent Attention, then the MoE layers
// GLM-4-MoE shares (with V3's defaults). num_key_value_heads and head_dim do not
// shape its attention (transformers writes head_dim = qk_rope_head_dim).
void parse_deepseek(const ConfigReader& c, HfModel& m, std::vector<std::string>& unsupported) {
  m.kv_heads = m.heads;
  m.head_dim = 0;
  const bool plain_q = c.j.contains("q_lora_rank") && c.j["q_lora_rank"].is_null();
  m.q_lora = plain_q ? 0 : c.integer_or("q_lora_rank", 1536);  // null: V2-Lite's plain q_proj
  m.kv_lora = c.integer_or("kv_lora_rank", 512);
  m.qk_nope = c.integer_or("qk_nope_head_dim", 128);
  m.qk_rope = c.integer_or("qk_rope_head_dim", 64);
  m.v_head = c.integer_or("v_head_dim", 128);
  constexpr int64_t kMaxWidth = int64_t(1) << 20;
  for (auto [key, value] : {std::pair<std::string, int64_t>{"q_lora_rank", m.q_lora},
                            {"kv_lora_rank", m.kv_lora},
                            {"qk_nope_head_dim", m.qk_nope},
                            {"qk_rope_head_dim", m.qk_rope},
                            {"v_head_dim", m.v_head}}) {
    const int64_t least = key == "q_lora_rank" ? 0 : 1;
    if (value < least || value > kMaxWidth)
      throw Error(str("'", c.path, "': \"", key, "\" is ", value, ": it must be between ", least,
                      " and ", kMaxWidth));
  }
  if (m.qk_rope % 2 != 0)
    throw Error(str("'", c.path, "': \"qk_rope_head_dim\" is ", m.qk_rope,
                    ": RoPE rotates pairs, it must be even"));
  if (m.v_head > m.qk_nope + m.qk_rope)
    unsupported.push_back(str("v_head_dim ", m.v_head,
                              " wider than qk_nope_head_dim + "
                              "qk_rope_head_dim (",
                              m.qk_nope + m.qk_rope, ")"));
  const bool v2 = m.family == "deepseek_v2";
  // transformers' DeepSeek-V2 always rotates interleaved pairs (complex multiplication)
  m.rope_interleave = v2 || c.boolean_or("rope_interleave", true);
  if (c.boolean_or("attention_bias", false))
    unsupported.push_back("attention biases (attention_bias: true)");
  if (c.integer_or("moe_layer_freq", 1) != 1)
    unsupported.push_back(str("MoE layers every ", c.integer("moe_layer_freq"),
                              " layers (moe_layer_freq; ours: every layer after "
                              "first_k_dense_replace)"));
  parse_deepseek_moe(c, m, unsupported,
                     v2 ? MoeDefaults{0, 1, 1, 1.0, 2, true} : MoeDefaults{3, 8, 4, 2.5});
}

// gpt-oss's own keys (configuration_gpt_oss.py), after the ones every family shares: biases on
// q/k/v/o and the experts (attention_bias, default true: we have them only together), the
// clamped SwiGLU (swiglu_alpha, swiglu_limit), sliding_window (default 128) on the layers
// layer_types marks (default: the even ones, as GptOssConfig fills it in; a null window with a
// sliding layer is refused, as transformers refuses it), softmax over the top-k logits, and
// experts stored MXFP4 (quantization_config quant_method "mxfp4"; no other method).
void parse_gpt_oss(const ConfigReader& c, HfModel& m, std::vector<std::string>& unsupported) {
  m.normalize = true;  // softmax over the chosen logits = ours over all, renormalised
  if (!c.boolean_or("attention_bias", true))
    unsupported.push_back(
        "gpt-oss without attention biases (attention_bias: false; our gpt_oss flavour has the "
        "q/k/v/o biases and the expert biases together)");
  m.swiglu_alpha = c.number_or("swiglu_alpha", 1.702);
  m.swiglu_limit = c.number_or("swiglu_limit", 7.0);
  std::vector<int64_t> layers;
  if (c.has("layer_types"))
    layers = sliding_layer_types(c, m, unsupported);
  else
    for (int64_t i = 0; i < m.layers; i += 2) layers.push_back(i);
  const bool absent = !c.j.contains("sliding_window");
  if (!absent && c.j["sliding_window"].is_null() && !layers.empty())
    throw Error(str("'", c.path, "': \"sliding_window\" is null, but ", layers.size(),
                    " layers slide (layer_types; transformers refuses this too)"));
  const int64_t window = absent ? 128 : c.integer_or("sliding_window", 0);
  if (!layers.empty() && window < 1)
    throw Error(str("'", c.path, "': \"sliding_window\" is ", window, ": it must be >= 1"));
  if (!layers.empty()) {
    m.sliding_window = window;
    if (static_cast<int64_t>(layers.size()) < m.layers) m.window_layers = layers;
  }
  if (c.has("quantization_config")) {
    const json& q = c.j["quantization_config"];
    const std::string method =
        q.is_object() && q.contains("quant_method") && q["quant_method"].is_string()
            ? q["quant_method"].get<std::string>()
            : q.dump();
    if (method == "mxfp4")
      m.mxfp4 = true;
    else
      unsupported.push_back(str("quantization_config quant_method '", method,
                                "' (import-hf reads gpt-oss's mxfp4 experts only)"));
  }
}

// gpt-oss's YaRN when config.json has neither rope_parameters nor rope_scaling: GptOssConfig's
// default dict (factor 32 over an original context of 4096, betas 32 / 1, truncate false).
void gpt_oss_default_yarn(HfModel& m) {
  m.rope_type = RopeType::yarn;
  m.yarn = ops::YarnSettings{};
  m.yarn.factor = 32;
  m.yarn.original_ctx = 4096;
  m.yarn.beta_fast = 32;
  m.yarn.beta_slow = 1;
  m.yarn.truncate = false;
}

// RoPE: rope_theta (transformers 4.x) or rope_parameters.rope_theta (5.x; gpt-oss's default
// 150000); scaling: YaRN from rope_scaling or rope_parameters (gpt-oss without either:
// GptOssConfig's default dict); GLM's partial_rotary_factor inside rope_parameters is read by
// parse_glm (rope_dim -1 says so); any other partial factor or scaling type is unsupported.
void parse_rope(const ConfigReader& c, HfModel& m, std::vector<std::string>& unsupported) {
  const json& j = c.j;
  const std::string& path = c.path;
  const bool glm = m.arch == Arch::glm4_moe, gpt_oss = m.arch == Arch::gpt_oss;
  m.rope_theta = c.number_or("rope_theta", gpt_oss ? 150000.0 : 10000.0);
  auto rope_type_of = [&](const std::string& key) -> std::string {
    if (!c.has(key)) return "default";
    const json& r = j[key];
    if (!r.is_object()) throw Error(str("'", path, "': \"", key, "\" is not an object"));
    if (key == "rope_parameters" && r.contains("rope_theta") && r["rope_theta"].is_number())
      m.rope_theta = r["rope_theta"].get<double>();
    if (key == "rope_parameters" && glm && r.contains("partial_rotary_factor"))
      m.rope_dim = -1;  // read below, from here
    else if (r.contains("partial_rotary_factor") && r["partial_rotary_factor"] != 1.0)
      unsupported.push_back(str("partial RoPE (", key, " partial_rotary_factor ",
                                r["partial_rotary_factor"].dump(), ")"));
    for (const char* type_key : {"rope_type", "type"})
      if (r.contains(type_key) && r[type_key].is_string()) return r[type_key].get<std::string>();
    return "default";
  };
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const std::string type = rope_type_of(key);
    if (type == "yarn")
      parse_yarn(ConfigReader{j[key], str(path, ": ", key)}, c, m);
    else if (type != "default")
      unsupported.push_back(str("RoPE scaling (", key, " type '", type, "')"));
  }
  if (gpt_oss && !c.has("rope_scaling") && !c.has("rope_parameters")) gpt_oss_default_yarn(m);
}

}  // namespace

HfModel parse_config(const json& j, const std::string& path,
                     std::vector<std::string>& unsupported) {
  ConfigReader c{j, path};
  HfModel m;
  m.family = c.string_or("model_type", "");
  m.arch = hf::arch_of_family(m.family, path);
  const bool mixtral = m.arch == Arch::mixtral;
  const bool qwen = m.arch == Arch::qwen2_moe || m.arch == Arch::qwen3_moe;
  const bool glm = m.arch == Arch::glm4_moe;
  const bool deepseek = m.arch == Arch::deepseek_v3;
  const bool gpt_oss = m.arch == Arch::gpt_oss;
  m.vocab = c.integer("vocab_size");
  m.hidden = c.integer("hidden_size");
  m.layers = c.integer("num_hidden_layers");
  m.heads = c.integer("num_attention_heads");
  m.kv_heads = c.integer_or("num_key_value_heads", m.heads);
  const std::string experts = experts_key(c, mixtral || gpt_oss);
  m.experts = c.integer(experts);
  m.top_k = c.integer("num_experts_per_tok");
  m.ffn = c.integer(qwen || glm || deepseek ? "moe_intermediate_size" : "intermediate_size");
  // Qwen: intermediate_size is the width of the dense MLPs of mlp_only_layers (kept though none
  // are imported: llama.cpp's converter writes it as feed_forward_length, export-hf writes it back)
  if (qwen) m.dense_ff = c.integer_or("intermediate_size", m.ffn);
  if (qwen && m.dense_ff < 1)
    throw Error(str("'", path, "': \"intermediate_size\" must be >= 1 (got ", m.dense_ff, ")"));
  m.max_positions = c.integer("max_position_embeddings");
  m.eps = c.number_or("rms_norm_eps", gpt_oss ? 1e-5 : 1e-6);
  m.aux_coef = c.number_or("router_aux_loss_coef", 0.0);
  m.jitter = mixtral ? c.number_or("router_jitter_noise", 0.0) : 0.0;
  // Mixtral always renormalises its top-k weights; the others say so in norm_topk_prob (GLM's
  // and DeepSeek-V3's default: true).
  m.normalize = mixtral ? true : c.boolean_or("norm_topk_prob", glm || deepseek);
  for (const std::string& key : {std::string("vocab_size"), std::string("hidden_size"),
                                 std::string("max_position_embeddings")})
    if (c.integer(key) < 1) throw Error(str("'", path, "': \"", key, "\" must be >= 1"));
  // The counts that size the import's plan before any tensor is read, bounded both ways: a
  // damaged or hostile config.json claiming more than any model has is refused here instead of
  // being allocated (the fuzzer found num_local_experts 8000000000143474).
  constexpr int64_t kMaxCount = int64_t(1) << 16;
  for (const std::string& key :
       {std::string("num_hidden_layers"), experts, std::string("num_experts_per_tok"),
        std::string("num_attention_heads"), std::string("num_key_value_heads")}) {
    if (!c.has(key)) continue;
    const int64_t value = c.integer(key);
    if (value < 1 || value > kMaxCount)
      throw Error(
          str("'", path, "': \"", key, "\" is ", value, ": it must be between 1 and ", kMaxCount));
  }

  parse_rope(c, m, unsupported);
  if (c.string_or("hidden_act", "silu") != "silu")
    unsupported.push_back(str("activation '", c.string_or("hidden_act", ""),
                              "' (hidden_act; our experts are SwiGLU with silu)"));
  m.tied = c.boolean_or("tie_word_embeddings", false);
  if (deepseek) {
    parse_deepseek(c, m, unsupported);
    return m;
  }
  // head_dim: Qwen3-MoE (and newer Mixtral configs) may make the heads wider or narrower than
  // hidden_size / num_attention_heads; Qwen2-MoE and OLMoE derive it.
  if (c.has("head_dim") && m.heads > 0 && c.integer("head_dim") * m.heads != m.hidden) {
    if (m.arch == Arch::qwen3_moe || mixtral || glm || gpt_oss)
      m.head_dim = c.integer("head_dim");
    else
      unsupported.push_back(str("head_dim ", c.integer("head_dim"),
                                " different from hidden_size / num_attention_heads"));
  }
  if (m.head_dim < 0) throw Error(str("'", path, "': \"head_dim\" must be >= 1"));
  if (glm) {
    parse_glm(c, m, unsupported);
    return m;
  }
  if (gpt_oss) {
    parse_gpt_oss(c, m, unsupported);
    return m;
  }
  // attention_bias puts biases on q, k, v and o; we have q/k/v biases only (Qwen2-MoE's, which
  // its classes create without a config key).
  if (c.boolean_or("attention_bias", false))
    unsupported.push_back("attention biases (attention_bias: true)");
  if (c.has("clip_qkv")) unsupported.push_back("q/k/v clipping (clip_qkv)");
  if (m.arch == Arch::qwen2_moe && !c.boolean_or("qkv_bias", true))
    unsupported.push_back("Qwen2-MoE without q/k/v biases (qkv_bias: false)");
  if (m.arch == Arch::qwen2_moe) {
    m.shared_ff = c.integer_or("shared_expert_intermediate_size", 0);
    if (m.shared_ff < 0)
      throw Error(str("'", path, "': \"shared_expert_intermediate_size\" must be >= 0"));
  } else if (c.integer_or("shared_expert_intermediate_size", 0) > 0) {
    unsupported.push_back(str("shared expert (shared_expert_intermediate_size ",
                              c.integer("shared_expert_intermediate_size"), ")"));
  }
  if (c.integer_or("n_shared_experts", 0) > 0)
    unsupported.push_back("shared expert (n_shared_experts)");
  if (c.integer_or("decoder_sparse_step", 1) != 1 ||
      (c.has("mlp_only_layers") && j["mlp_only_layers"].is_array() &&
       !j["mlp_only_layers"].empty()))
    unsupported.push_back("dense MLP layers (decoder_sparse_step / mlp_only_layers)");
  parse_window(c, m, unsupported);
  return m;
}

}  // namespace moe::io::hf
