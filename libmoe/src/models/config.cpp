#include "moe/models/config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/json_text.h"
#include "moe/error.h"
#include "moe/ops/dense.h"
#include "moe/ops/moe.h"
#include "moe/settings.h"

namespace moe {

namespace {
constexpr struct {
  Arch arch;
  const char* name;
} kArchs[] = {{Arch::gpt, "gpt"},
              {Arch::mixtral, "mixtral"},
              {Arch::qwen2_moe, "qwen2_moe"},
              {Arch::qwen3_moe, "qwen3_moe"},
              {Arch::olmoe, "olmoe"},
              {Arch::glm4_moe, "glm4_moe"},
              {Arch::deepseek_v3, "deepseek_v3"},
              {Arch::gpt_oss, "gpt_oss"}};
}  // namespace

Arch parse_arch(const std::string& name) {
  for (const auto& a : kArchs)
    if (name == a.name) return a.arch;
  throw UsageError(
      str("unknown ", flag_for(Setting::arch), " '", name,
          "' (expected gpt, mixtral, qwen2_moe, qwen3_moe, olmoe, glm4_moe, deepseek_v3 or "
          "gpt_oss)"));
}

const char* arch_name(Arch arch) {
  for (const auto& a : kArchs)
    if (arch == a.arch) return a.name;
  return "?";
}

nn::RouterScoring parse_router_scoring(const std::string& name) {
  if (name == "softmax") return nn::RouterScoring::softmax;
  if (name == "sigmoid") return nn::RouterScoring::sigmoid;
  throw UsageError(
      str("unknown ", flag_for(Setting::router), " '", name, "' (expected softmax or sigmoid)"));
}

const char* router_scoring_name(nn::RouterScoring scoring) {
  return scoring == nn::RouterScoring::sigmoid ? "sigmoid" : "softmax";
}

RopeType parse_rope_type(const std::string& name) {
  if (name == "none") return RopeType::none;
  if (name == "yarn") return RopeType::yarn;
  throw UsageError(str("unknown RoPE scaling '", name, "' (expected none or yarn)"));
}

const char* rope_type_name(RopeType type) { return type == RopeType::yarn ? "yarn" : "none"; }

ops::RopeScaling ModelConfig::rope_scaling() const {
  if (rope_type == RopeType::none) return {};
  return ops::yarn_scaling(yarn, rope_theta, rope_dim_resolved());
}

double ModelConfig::attention_scale() const {
  if (rope_type != RopeType::yarn || arch != Arch::deepseek_v3 || !(yarn.mscale_all_dim > 0))
    return 1.0;
  const double m = ops::yarn_mscale(yarn.factor, yarn.mscale_all_dim);
  return m * m;
}

void ModelConfig::validate_rope() const {
  if (rope_type == RopeType::none) return;
  MOE_USAGE_CHECK(
      arch != Arch::gpt, flag_for(Setting::rope_scaling), " ", rope_type_name(rope_type),
      " needs a RoPE architecture: ", flag_for(Setting::arch), " gpt has learned positions");
  (void)rope_scaling();  // throws naming the YaRN setting that gives no ramp
}

int64_t ModelConfig::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t e : experts_per_layer) n += e > 0;
  return n;
}

std::vector<int64_t> ModelConfig::moe_blocks() const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < experts_per_layer.size(); ++i)
    if (experts_per_layer[i] > 0) out.push_back(static_cast<int64_t>(i));
  return out;
}

void ModelConfig::resolve() {
  // Bounded before anything is sized by it (a vector a layer just below): import-hf's bound too.
  MOE_USAGE_CHECK(layers >= 1 && layers <= kMaxLayers, flag_for(Setting::layers),
                  " must be between 1 and ", kMaxLayers, " (got ", layers, ")");
  MOE_USAGE_CHECK(moe_every >= 1, flag_for(Setting::moe_every), " must be >= 1 (got ", moe_every,
                  ")");
  std::vector<int64_t> resolved(layers, 0);
  std::vector<int64_t> moe_layers;
  for (int64_t i = 0; i < layers; ++i)
    if ((i + 1) % moe_every == 0) moe_layers.push_back(i);
  if (experts_per_layer.empty()) {
    for (int64_t i : moe_layers) resolved[i] = experts;
  } else if (static_cast<int64_t>(experts_per_layer.size()) == layers) {
    resolved = experts_per_layer;  // one entry per layer, 0 = dense
  } else if (experts_per_layer.size() == moe_layers.size()) {
    for (size_t j = 0; j < moe_layers.size(); ++j) resolved[moe_layers[j]] = experts_per_layer[j];
  } else {
    throw UsageError(str(flag_for(Setting::experts_per_layer), " has ", experts_per_layer.size(),
                         " entries; give one per layer (", layers,
                         ", 0 = dense) or one per MoE layer (", moe_layers.size(), " with ",
                         flag_for(Setting::moe_every), " ", moe_every, ")"));
  }
  experts_per_layer = resolved;
  validate();
}

namespace {

// The head setting deepseek_v3 was given that its latent attention replaces (its heads are
// qk_nope_dim + qk_rope_dim wide, each with its own k and v, no bias or norm), or nullptr.
const Setting* latent_misfit(const ModelConfig& c) {
  static constexpr Setting kHeads[] = {Setting::rope_dim, Setting::head_dim, Setting::kv_heads,
                                       Setting::qkv_bias, Setting::qk_norm};
  const int64_t head = c.qk_nope_dim + c.qk_rope_dim;
  const bool set[] = {c.rope_dim != 0, c.head_dim != 0 && c.head_dim != head,
                      c.kv_heads_resolved() != c.heads, c.qkv_bias, c.qk_norm};
  for (size_t i = 0; i < std::size(kHeads); ++i)
    if (set[i]) return &kHeads[i];
  return nullptr;
}

}  // namespace

// Named by moe-train's flags. import-hf and import-gguf check these sizes first under their
// files' own keys (io/hf_config.cpp, io/gguf_import_deepseek2.cpp): a bad size reaches these
// messages from the flags, or from a checkpoint's model config (its keys are the flags' names).
void ModelConfig::validate_mla() const {
  const Setting latent[] = {Setting::q_lora_rank, Setting::kv_lora_rank, Setting::qk_nope_dim,
                            Setting::qk_rope_dim, Setting::v_head_dim};
  const int64_t sizes[] = {q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim};
  if (arch != Arch::deepseek_v3) {
    for (size_t i = 0; i < std::size(latent); ++i)
      MOE_USAGE_CHECK(sizes[i] == 0, flag_for(latent[i]), " is deepseek_v3's, not ",
                      arch_name(arch), "'s (Multi-head Latent Attention; got ", sizes[i], ")");
    return;
  }
  MOE_USAGE_CHECK(kv_lora_rank >= 1, flag_for(Setting::kv_lora_rank), " must be >= 1 with ",
                  flag_for(Setting::arch), " deepseek_v3 (got ", kv_lora_rank, ")");
  MOE_USAGE_CHECK(q_lora_rank >= 0, flag_for(Setting::q_lora_rank),
                  " must be >= 0 (0 = a plain q projection; got ", q_lora_rank, ")");
  MOE_USAGE_CHECK(qk_nope_dim >= 1, flag_for(Setting::qk_nope_dim), " must be >= 1 (got ",
                  qk_nope_dim, ")");
  MOE_USAGE_CHECK(qk_rope_dim >= 2 && qk_rope_dim % 2 == 0, flag_for(Setting::qk_rope_dim),
                  " must be even and >= 2: RoPE turns pairs of features (got ", qk_rope_dim, ")");
  const int64_t head = qk_nope_dim + qk_rope_dim;
  MOE_USAGE_CHECK(v_head_dim >= 1 && v_head_dim <= head, flag_for(Setting::v_head_dim),
                  " must be between 1 and ", flag_for(Setting::qk_nope_dim), " + ",
                  flag_for(Setting::qk_rope_dim), " = ", head, " (got ", v_head_dim, ")");
  if (const Setting* misfit = latent_misfit(*this))
    throw UsageError(str(flag_for(*misfit), " does not apply to ", flag_for(Setting::arch),
                         " deepseek_v3: its heads are shaped by its latent attention (",
                         flag_for(Setting::qk_nope_dim), ", ", flag_for(Setting::qk_rope_dim), ", ",
                         flag_for(Setting::v_head_dim), ")"));
}

int64_t ModelConfig::window_of(int64_t layer) const {
  if (sliding_window == 0 || window_layers.empty()) return sliding_window;
  return std::binary_search(window_layers.begin(), window_layers.end(), layer) ? sliding_window : 0;
}

void ModelConfig::validate_window() const {
  MOE_USAGE_CHECK(sliding_window >= 0 && sliding_window <= kMaxSeq,
                  "the sliding window must be between 0 (none) and ", kMaxSeq, " positions (got ",
                  sliding_window, ")");
  MOE_USAGE_CHECK(window_layers.empty() || sliding_window > 0,
                  "windowed layers are listed but the sliding window is 0 (none)");
  for (size_t i = 0; i < window_layers.size(); ++i)
    MOE_USAGE_CHECK(window_layers[i] >= 0 && window_layers[i] < layers &&
                        (i == 0 || window_layers[i] > window_layers[i - 1]),
                    "the windowed layers must be distinct layer indices 0..", layers - 1,
                    " in ascending order (got ", window_layers[i], " at entry ", i, ")");
  // Latent attention's decode multiplies through the compressed cache (nn/mla.h) with no window.
  MOE_USAGE_CHECK(sliding_window == 0 || !mla(),
                  "a sliding window is not deepseek_v3's: its latent attention has none");
}

void ModelConfig::validate_swiglu() const {
  // Bounded as a float (SwigluClamp holds them so): a larger limit would overflow to inf.
  auto bounded = [](double v) { return std::isfinite(v) && v > 0 && v <= 3.0e38; };
  MOE_USAGE_CHECK(bounded(swiglu_alpha), flag_for(Setting::swiglu_alpha),
                  " (the clamped SwiGLU's sigmoid slope) must be a finite number > 0 (got ",
                  swiglu_alpha, ")");
  MOE_USAGE_CHECK(bounded(swiglu_limit), flag_for(Setting::swiglu_limit),
                  " (the clamped SwiGLU's clamp) must be a finite number > 0 (got ", swiglu_limit,
                  ")");
  const ModelConfig defaults;
  MOE_USAGE_CHECK(arch == Arch::gpt_oss || (swiglu_alpha == defaults.swiglu_alpha &&
                                            swiglu_limit == defaults.swiglu_limit),
                  flag_for(Setting::swiglu_alpha), " and ", flag_for(Setting::swiglu_limit),
                  " are gpt_oss's (its clamped SwiGLU); ", flag_for(Setting::arch), " ",
                  arch_name(arch), "'s experts do not clamp");
  if (arch != Arch::gpt_oss) return;
  // Its clamped SwiGLU is an expert activation only (nn/mlp.cpp, nn/moe_layer.cpp refuse it).
  for (int64_t i = 0; i < layers && i < int64_t(experts_per_layer.size()); ++i)
    MOE_USAGE_CHECK(experts_per_layer[size_t(i)] > 0, "gpt_oss has experts in every layer; layer ",
                    i, " is dense (give ", flag_for(Setting::moe_every), " 1)");
  MOE_USAGE_CHECK(
      !residual_moe && shared_expert_ff == 0, "gpt_oss has no ",
      residual_moe ? flag_for(Setting::residual_moe) : flag_for(Setting::shared_expert_ff),
      ": its clamped SwiGLU is its routed experts' alone");
}

namespace {

// The heads' shape: head_dim and kv_heads against d_model, heads and the architecture.
void check_attention(const ModelConfig& c) {
  MOE_USAGE_CHECK(c.head_dim >= 0, flag_for(Setting::head_dim),
                  " must be >= 0 (0 = d-model/heads; got ", c.head_dim, ")");
  MOE_USAGE_CHECK(c.head_dim > 0 || c.mla() || c.d_model % c.heads == 0, flag_for(Setting::heads),
                  " ", c.heads, " does not divide ", flag_for(Setting::d_model), " ", c.d_model,
                  " (or give ", flag_for(Setting::head_dim), ")");
  const int64_t hd = c.head_dim_resolved();
  int64_t kv = c.kv_heads_resolved();
  MOE_USAGE_CHECK(kv >= 1 && c.heads % kv == 0, flag_for(Setting::kv_heads), " ", kv,
                  " does not divide ", flag_for(Setting::heads), " ", c.heads);
  MOE_USAGE_CHECK(c.arch != Arch::gpt || kv == c.heads, flag_for(Setting::kv_heads),
                  " (grouped-query attention) needs a RoPE architecture, not ",
                  flag_for(Setting::arch), " gpt");
  MOE_USAGE_CHECK(c.arch != Arch::gpt || c.head_dim == 0 || c.head_dim * c.heads == c.d_model,
                  flag_for(Setting::head_dim), " needs a RoPE architecture, not ",
                  flag_for(Setting::arch), " gpt");
  MOE_USAGE_CHECK(c.arch == Arch::gpt || c.mla() || hd % 2 == 0,
                  "RoPE needs an even head dimension (got ", hd, ")");
}

// Each MoE layer's experts hold top-k (and, grouped, the chosen groups).
void check_expert_layers(const ModelConfig& c) {
  for (int64_t i = 0; i < c.layers; ++i) {
    int64_t e = c.experts_per_layer[i];
    MOE_USAGE_CHECK(e >= 0, "layer ", i, ": negative expert count ", e);
    if (e == 0) continue;
    int64_t k = c.residual_moe ? 1 : c.top_k;
    MOE_USAGE_CHECK(k <= e, flag_for(Setting::top_k), " ", c.top_k, " is larger than the ", e,
                    " experts of layer ", i);
    MOE_USAGE_CHECK(e >= 2 || c.residual_moe, "layer ", i,
                    " has 1 expert: an MoE layer needs >= 2 (or ", flag_for(Setting::residual_moe),
                    ")");
    MOE_USAGE_CHECK(c.router_groups == 1 || (e % c.router_groups == 0 && e / c.router_groups >= 2 &&
                                             k <= c.router_group_topk * (e / c.router_groups)),
                    "layer ", i, ": its ", e, " experts do not form ", c.router_groups,
                    " groups of two or more holding top-k ", k, " in ", c.router_group_topk,
                    " chosen groups");
  }
}

}  // namespace

void ModelConfig::validate() const {
  MOE_USAGE_CHECK(vocab_size >= 2, "vocabulary size must be >= 2 (got ", vocab_size, ")");
  MOE_USAGE_CHECK(d_model >= 1 && heads >= 1, flag_for(Setting::d_model), " and ",
                  flag_for(Setting::heads), " must be >= 1");
  validate_mla();
  validate_rope();
  validate_window();
  validate_swiglu();
  check_attention(*this);
  MOE_USAGE_CHECK(shared_expert_ff >= 0, flag_for(Setting::shared_expert_ff),
                  " must be >= 0 (0 = none; got ", shared_expert_ff, ")");
  MOE_USAGE_CHECK(balance_bias_rate >= 0 && std::isfinite(balance_bias_rate),
                  flag_for(Setting::balance_bias_rate), " must be a finite number >= 0 (got ",
                  balance_bias_rate, ")");
  MOE_USAGE_CHECK(router_center_rate >= 0 && router_center_rate <= 1,
                  flag_for(Setting::router_center_rate), " must be in [0, 1] (0 = off; got ",
                  router_center_rate, ")");
  MOE_USAGE_CHECK(d_ff >= 1, flag_for(Setting::d_ff), " must be >= 1 (got ", d_ff, ")");
  MOE_USAGE_CHECK(dense_ff >= 0, flag_for(Setting::dense_ff),
                  " (the dense layers' width) must be >= 0 (0 = d_ff; got ", dense_ff, ")");
  MOE_USAGE_CHECK(rope_dim >= 0 && rope_dim <= head_dim_resolved() && rope_dim % 2 == 0,
                  flag_for(Setting::rope_dim),
                  " (the rotated features of a head) must be even and at most its ",
                  head_dim_resolved(), " (0 = all; got ", rope_dim, ")");
  MOE_USAGE_CHECK(rope_dim == 0 || arch != Arch::gpt, "partial RoPE needs a RoPE architecture");
  // Only glm4_moe's flavour reads them: the others fix their attention (qwen2_moe: q/k/v biases,
  // qwen3_moe: per-head qk-norm, olmoe: full-width qk-norm), so they would be silently ignored.
  MOE_USAGE_CHECK(arch == Arch::glm4_moe || (!qkv_bias && !qk_norm), flag_for(Setting::qkv_bias),
                  " and ", flag_for(Setting::qk_norm), " are glm4_moe's options; ",
                  flag_for(Setting::arch), " ", arch_name(arch),
                  " fixes its attention (qwen2_moe always has q/k/v biases, qwen3_moe a per-head "
                  "qk-norm)");
  MOE_USAGE_CHECK(routed_scale > 0 && std::isfinite(routed_scale), flag_for(Setting::routed_scale),
                  " (the routed experts' scale) must be a finite number > 0 (got ", routed_scale,
                  ")");
  MOE_USAGE_CHECK(router_groups >= 1 && router_groups <= ops::kMaxRouterGroups &&
                      router_group_topk >= 1 && router_group_topk <= router_groups,
                  flag_for(Setting::router_groups), " must be 1..", ops::kMaxRouterGroups, " with ",
                  flag_for(Setting::router_group_topk), " 1..groups of them chosen (got ",
                  router_groups, " groups, ", router_group_topk, " chosen)");
  MOE_USAGE_CHECK(seq >= 1 && seq <= kMaxSeq, flag_for(Setting::seq), " must be between 1 and ",
                  kMaxSeq, " (positions are 32-bit; got ", seq, ")");
  MOE_USAGE_CHECK(top_k >= 1, flag_for(Setting::top_k), " must be >= 1 (got ", top_k, ")");
  MOE_USAGE_CHECK(capacity_factor >= 0 && std::isfinite(capacity_factor),
                  flag_for(Setting::capacity_factor),
                  " must be a finite number >= 0 (0 = dropless)");
  MOE_USAGE_CHECK(aux_loss_coef >= 0 && z_loss_coef >= 0 && std::isfinite(aux_loss_coef) &&
                      std::isfinite(z_loss_coef),
                  "loss coefficients must be finite numbers >= 0");
  MOE_USAGE_CHECK(router_jitter >= 0 && router_jitter < 1, flag_for(Setting::router_jitter),
                  " must be in [0, 1)");
  MOE_USAGE_CHECK(norm_eps > 0 && std::isfinite(norm_eps), flag_for(Setting::norm_eps),
                  " must be a finite number > 0");
  MOE_USAGE_CHECK(rope_theta > 0 && std::isfinite(rope_theta), flag_for(Setting::rope_theta),
                  " must be a finite number > 0 (got ", rope_theta, ")");
  MOE_USAGE_CHECK(is_floating(dtype), flag_for(Setting::dtype), " must be f32, bf16 or f16");
  MOE_USAGE_CHECK(static_cast<int64_t>(experts_per_layer.size()) == layers,
                  "model config: experts_per_layer has ", experts_per_layer.size(), " entries for ",
                  layers, " layers");
  check_expert_layers(*this);
}

namespace {

// The keys every checkpoint has (the ones added later read with defaults, below).
nlohmann::json listed_keys(const ModelConfig& c) {
  return nlohmann::json{{"arch", arch_name(c.arch)},
                        {"vocab_size", c.vocab_size},
                        {"layers", c.layers},
                        {"d_model", c.d_model},
                        {"heads", c.heads},
                        {"kv_heads", c.kv_heads_resolved()},
                        {"d_ff", c.d_ff},
                        {"head_dim", c.head_dim_resolved()},
                        {"shared_expert_ff", c.shared_expert_ff},
                        {"dense_ff", c.dense_ff},
                        {"rope_dim", c.rope_dim},
                        {"qkv_bias", c.qkv_bias},
                        {"qk_norm", c.qk_norm},
                        {"router_groups", c.router_groups},
                        {"router_group_topk", c.router_group_topk},
                        {"routed_scale", c.routed_scale},
                        {"q_lora_rank", c.q_lora_rank},
                        {"kv_lora_rank", c.kv_lora_rank},
                        {"qk_nope_dim", c.qk_nope_dim},
                        {"qk_rope_dim", c.qk_rope_dim},
                        {"v_head_dim", c.v_head_dim},
                        {"router_scoring", router_scoring_name(c.router_scoring)},
                        {"balance_bias_rate", c.balance_bias_rate},
                        {"router_center_rate", c.router_center_rate},
                        {"seq", c.seq},
                        {"experts", c.experts},
                        {"experts_per_layer", c.experts_per_layer},
                        {"moe_every", c.moe_every},
                        {"top_k", c.top_k},
                        {"capacity_factor", c.capacity_factor},
                        {"aux_loss_coef", c.aux_loss_coef},
                        {"z_loss_coef", c.z_loss_coef},
                        {"residual_moe", c.residual_moe},
                        {"normalize_topk", c.normalize_topk},
                        {"router_jitter", c.router_jitter},
                        {"norm_eps", c.norm_eps},
                        {"rope_theta", c.rope_theta},
                        {"dtype", dtype_name(c.dtype)}};
}

}  // namespace

nlohmann::json to_json(const ModelConfig& c) {
  nlohmann::json j = listed_keys(c);
  // Written only when set: a model without them writes the file it wrote before they existed.
  if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
  if (!c.window_layers.empty()) j["window_layers"] = c.window_layers;
  if (c.tie_embeddings) j["tie_embeddings"] = true;
  if (c.arch == Arch::gpt_oss) {  // the other families' files stay as they were
    j["swiglu_alpha"] = c.swiglu_alpha;
    j["swiglu_limit"] = c.swiglu_limit;
  }
  if (c.rope_type == RopeType::yarn) {
    j["rope_type"] = rope_type_name(c.rope_type);
    j["yarn"] = {{"factor", c.yarn.factor},
                 {"original_ctx", c.yarn.original_ctx},
                 {"beta_fast", c.yarn.beta_fast},
                 {"beta_slow", c.yarn.beta_slow},
                 {"mscale", c.yarn.mscale},
                 {"mscale_all_dim", c.yarn.mscale_all_dim},
                 {"attention_factor", c.yarn.attention_factor},
                 {"truncate", c.yarn.truncate}};
  }
  return j;
}

ModelConfig model_config_from_json(const nlohmann::json& j) {
  ModelConfig c;
  try {
    c.arch = parse_arch(j.at("arch").get<std::string>());
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.layers = j.at("layers").get<int64_t>();
    c.d_model = j.at("d_model").get<int64_t>();
    c.heads = j.at("heads").get<int64_t>();
    c.kv_heads = j.at("kv_heads").get<int64_t>();
    c.d_ff = j.at("d_ff").get<int64_t>();
    c.seq = j.at("seq").get<int64_t>();
    c.experts = j.at("experts").get<int64_t>();
    c.experts_per_layer = j.at("experts_per_layer").get<std::vector<int64_t>>();
    c.moe_every = j.at("moe_every").get<int64_t>();
    c.top_k = j.at("top_k").get<int64_t>();
    c.capacity_factor = j.at("capacity_factor").get<double>();
    c.aux_loss_coef = j.at("aux_loss_coef").get<double>();
    c.z_loss_coef = j.at("z_loss_coef").get<double>();
    c.residual_moe = j.at("residual_moe").get<bool>();
    c.normalize_topk = j.at("normalize_topk").get<bool>();
    c.router_jitter = j.at("router_jitter").get<double>();
    c.norm_eps = j.at("norm_eps").get<double>();
    c.rope_theta = j.at("rope_theta").get<double>();
    c.dtype = parse_dtype(j.at("dtype").get<std::string>());
    // Keys added after the first checkpoints: absent means the old meaning.
    c.head_dim = j.value("head_dim", int64_t{0});
    if (c.heads > 0 && c.head_dim * c.heads == c.d_model) c.head_dim = 0;
    c.shared_expert_ff = j.value("shared_expert_ff", int64_t{0});
    c.router_scoring = parse_router_scoring(j.value("router_scoring", std::string("softmax")));
    c.balance_bias_rate = j.value("balance_bias_rate", 0.0);
    c.router_center_rate = j.value("router_center_rate", 0.0);
    c.dense_ff = j.value("dense_ff", int64_t{0});
    c.rope_dim = j.value("rope_dim", int64_t{0});
    c.qkv_bias = j.value("qkv_bias", false);
    c.qk_norm = j.value("qk_norm", false);
    c.router_groups = j.value("router_groups", int64_t{1});
    c.router_group_topk = j.value("router_group_topk", int64_t{1});
    c.routed_scale = j.value("routed_scale", 1.0);
    c.q_lora_rank = j.value("q_lora_rank", int64_t{0});
    c.kv_lora_rank = j.value("kv_lora_rank", int64_t{0});
    c.qk_nope_dim = j.value("qk_nope_dim", int64_t{0});
    c.qk_rope_dim = j.value("qk_rope_dim", int64_t{0});
    c.v_head_dim = j.value("v_head_dim", int64_t{0});
    c.sliding_window = j.value("sliding_window", int64_t{0});
    c.window_layers = j.value("window_layers", std::vector<int64_t>{});
    c.tie_embeddings = j.value("tie_embeddings", false);
    c.swiglu_alpha = j.value("swiglu_alpha", c.swiglu_alpha);
    c.swiglu_limit = j.value("swiglu_limit", c.swiglu_limit);
    c.rope_type = parse_rope_type(j.value("rope_type", std::string("none")));
    if (c.rope_type == RopeType::yarn) {
      const nlohmann::json& y = j.at("yarn");
      c.yarn.factor = y.at("factor").get<double>();
      c.yarn.original_ctx = y.at("original_ctx").get<double>();
      c.yarn.beta_fast = y.at("beta_fast").get<double>();
      c.yarn.beta_slow = y.at("beta_slow").get<double>();
      c.yarn.mscale = y.at("mscale").get<double>();
      c.yarn.mscale_all_dim = y.at("mscale_all_dim").get<double>();
      c.yarn.attention_factor = y.at("attention_factor").get<double>();
      c.yarn.truncate = y.at("truncate").get<bool>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(str("model config: ", json_error_words(e)));
  }
  c.validate();
  return c;
}

}  // namespace moe
