// GGUF import (see moe/io/gguf_import.h and docs/FORMATS.md "GGUF import"):
// keys -> model config, llama.cpp's tensor names -> ours (the inverse of
// io/gguf_write.cpp's table), each tensor converted on its own. Shape letters:
// V vocabulary, D hidden, H heads, KV kv heads, hd head dim, F expert hidden,
// Fs shared expert hidden, E experts, Fd the leading dense layers' hidden (glm4moe).
#include "moe/io/gguf_import.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <regex>
#include <set>

#include "backend/cpu/gemv.h"
#include "backend/cpu/quant_blocks.h"
#include "io/gguf_blocks.h"
#include "io/gguf_import_deepseek2.h"
#include "io/gguf_import_gpt_oss.h"
#include "io/gguf_import_record.h"
#include "io/gguf_keys.h"
#include "io/gguf_tokenizer.h"
#include "kernels/convert.h"
#include "moe/error.h"
#include "moe/io/convert.h"
#include "moe/io/finite.h"
#include "moe/models/flavour.h"
#include "moe/ops/moe.h"
#include "moe/version.h"

namespace moe::io {

namespace {

using gguf::Keys;

// llama.cpp's architectures for our flavours, and what each hard-codes
// (io/gguf_write.cpp).
struct GgufArch {
  const char* name;
  Arch arch;
  bool normalize_topk;  // its MoE renormalises the top-k weights (unless
                        // expert_weights_norm)
  bool permute_qk;      // NORM rope (adjacent pairs): the file's q/k rows are
                        // permuted
};

constexpr GgufArch kArchs[] = {
    {"llama", Arch::mixtral, true, true},       {"qwen2moe", Arch::qwen2_moe, false, false},
    {"qwen3moe", Arch::qwen3_moe, true, false}, {"olmoe", Arch::olmoe, false, false},
    {"glm4moe", Arch::glm4_moe, false, false},  {"deepseek2", Arch::deepseek_v3, false, false},
    {"gpt-oss", Arch::gpt_oss, true, false}};  // softmax over the top-k: renormalised

// Bounds of the counts and widths that size the plan, checked before anything
// is sized by them (the tensors' own dimensions are bounded by the file's size,
// and checked against these).
constexpr int64_t kMaxCount = int64_t(1) << 16, kMaxWidth = int64_t(1) << 24;

const GgufArch& arch_of(const Keys& k) {
  const std::string name = k.text("general.architecture");
  for (const GgufArch& a : kArchs)
    if (name == a.name) return a;
  throw Error(str("'", k.path(), "': GGUF architecture '", name,
                  "' is not supported (supported: llama with experts (Mixtral), qwen2moe, "
                  "qwen3moe, olmoe, glm4moe, deepseek2, gpt-oss)"));
}

// What llama.cpp can say of a model that ours cannot run: refused by name.
// glm4moe and deepseek2 read their routing and their dense layers from keys (glm4moe_config,
// deepseek2_config); the others may not have them.
void refuse_unsupported(const Keys& k, const std::string& a, int64_t seq) {
  auto refuse = [&](const std::string& key, const std::string& what) {
    throw Error(str("'", k.path(), "': ", what, " (GGUF key '", key, "') is not supported"));
  };
  const bool deepseek = a == "deepseek2", glm = a == "glm4moe" || deepseek;
  if (!glm && k.has(a + ".expert_gating_func") && k.integer(a + ".expert_gating_func") != 1)
    refuse(a + ".expert_gating_func", "expert gating other than softmax");
  if (!glm && k.has(a + ".expert_weights_scale") && k.real(a + ".expert_weights_scale") != 1.0)
    refuse(a + ".expert_weights_scale", "scaled expert weights");
  if (!glm && k.integer_or(a + ".leading_dense_block_count", 0) != 0)
    refuse(a + ".leading_dense_block_count", "dense (non-MoE) layers");
  const std::string scaling = k.text_or(a + ".rope.scaling.type", "none");
  if (scaling != "none" && scaling != "yarn")
    refuse(a + ".rope.scaling.type", str("RoPE scaling '", scaling, "'"));
  if (scaling == "yarn" && k.real_or(a + ".rope.scaling.attn_factor", 1.0) != 1.0)
    refuse(a + ".rope.scaling.attn_factor", "a YaRN attention factor set by hand");
  if (scaling == "yarn" && !deepseek &&
      k.real_or(a + ".rope.scaling.yarn_log_multiplier", 0.0) != 0.0)
    refuse(a + ".rope.scaling.yarn_log_multiplier", "DeepSeek's YaRN log multiplier");
  if (k.has(a + ".attention.clamp_kqv")) refuse(a + ".attention.clamp_kqv", "q/k/v clipping");
  const int64_t window = k.integer_or(a + ".attention.sliding_window", 0);
  if (window > 0 && window < seq && a != "gpt-oss")  // gpt-oss's even layers: gpt_oss_config
    refuse(a + ".attention.sliding_window",
           str("a sliding window of ", window, " tokens, shorter than the context ", seq));
  if (k.integer_or(a + ".expert_shared_count", 0) > 0 && a != "qwen2moe" && !glm)
    refuse(a + ".expert_shared_count", "shared experts");
}

// YaRN as llama.cpp's rope.scaling.* keys say it (gguf_write.cpp's write_yarn_keys): the factor
// and the original context; llama.cpp takes YaRN's defaults for the rest (betas 32 / 1, a
// truncated range, the attention factor 0.1 ln(factor) + 1), and so does ModelConfig's yarn.
void yarn_config(const Keys& k, const std::string& a, ModelConfig& mc) {
  const std::string p = a + ".rope.scaling.";
  if (k.text_or(p + "type", "none") != "yarn") return;
  mc.rope_type = RopeType::yarn;
  mc.yarn.factor = k.real(p + "factor");
  if (!(mc.yarn.factor >= 1)) k.fail(p + "factor", str("is ", mc.yarn.factor, ": YaRN's is >= 1"));
  mc.yarn.original_ctx = double(k.bounded(p + "original_context_length", 1, int64_t(1) << 31));
}

// glm4moe's own keys (io/gguf_write.cpp's write_glm4moe_keys) and what its tensors say of the
// attention (q/k/v biases, per-head q/k norms: no key holds them). Sigmoid scores with a selection
// bias (exp_probs_b), group-limited top-k, scaled gate weights, the first layers dense MLPs
// feed_forward_length wide, and a shared expert of expert_shared_count experts.
void glm4moe_config(const Keys& k, const GgufFile& f, ModelConfig& mc) {
  const std::string a = "glm4moe.";
  if (k.integer_or(a + "expert_gating_func", 2) != 2)
    k.fail(a + "expert_gating_func",
           str("is ", k.integer(a + "expert_gating_func"),
               ": glm4moe's expert gating other than sigmoid (2) is not supported"));
  mc.router_scoring = nn::RouterScoring::sigmoid;
  mc.routed_scale = k.real_or(a + "expert_weights_scale", 1.0);
  if (!(mc.routed_scale > 0)) k.fail(a + "expert_weights_scale", str("is ", mc.routed_scale));
  mc.router_groups = k.has(a + "expert_group_count")
                         ? k.bounded(a + "expert_group_count", 1, ops::kMaxRouterGroups)
                         : 1;
  mc.router_group_topk = k.has(a + "expert_group_used_count")
                             ? k.bounded(a + "expert_group_used_count", 1, mc.router_groups)
                             : mc.router_groups;
  const int64_t dense = k.bounded(a + "leading_dense_block_count", 0, mc.layers - 1);
  const int64_t Fd = k.bounded(a + "feed_forward_length", 1, kMaxWidth);
  mc.dense_ff = dense > 0 && Fd != mc.d_ff ? Fd : 0;
  mc.experts_per_layer.assign(static_cast<size_t>(mc.layers), mc.experts);
  std::fill_n(mc.experts_per_layer.begin(), dense, 0);
  mc.shared_expert_ff = k.bounded(a + "expert_shared_count", 0, kMaxCount) * mc.d_ff;
  if (mc.shared_expert_ff > kMaxWidth)
    k.fail(a + "expert_shared_count", str("makes a shared expert ", mc.shared_expert_ff, " wide"));
  const std::string first = str("blk.", dense, ".");  // the first MoE layer (every layer alike)
  for (const GgufTensorInfo& t : f.tensors) {
    mc.qkv_bias |= t.name == first + "attn_q.bias";
    mc.qk_norm |= t.name == first + "attn_q_norm.weight";
  }
}

// The head width (key_length, by llama.cpp's default embedding_length / head_count) and the
// features RoPE rotates of the architectures with q/k/v projections.
void head_config(const Keys& k, const GgufArch& arch, ModelConfig& mc) {
  const std::string a = std::string(arch.name) + ".";
  if (!k.has(a + "attention.key_length") && mc.d_model % mc.heads != 0)
    throw Error(str("'", k.path(), "': no GGUF key '", a, "attention.key_length', and ",
                    "embedding_length ", mc.d_model, " is not a multiple of head_count ",
                    mc.heads));
  const int64_t hd = k.has(a + "attention.key_length")
                         ? k.bounded(a + "attention.key_length", 2, kMaxWidth)
                         : mc.d_model / mc.heads;
  if (k.integer_or(a + "attention.value_length", hd) != hd)
    throw Error(str("'", k.path(), "': value heads of another width than key heads (", a,
                    "attention.value_length) are not supported"));
  const int64_t rope = k.integer_or(a + "rope.dimension_count", hd);
  if (arch.arch == Arch::glm4_moe && rope >= 2 && rope < hd && rope % 2 == 0)
    mc.rope_dim = rope;  // glm4moe's partial RoPE: the first rope features of each head
  else if (rope != hd)
    throw Error(str("'", k.path(), "': rotary embedding of ", k.integer(a + "rope.dimension_count"),
                    " of ", hd, " head dimensions (", a,
                    "rope.dimension_count) is not supported: ours rotates them all"));
  mc.head_dim = hd * mc.heads == mc.d_model ? 0 : hd;
}

// The model config the keys describe (the rest of ours: training settings the
// file does not hold, at 0; the exporter's record may replace them,
// adopt_record).
ModelConfig config_from_keys(const Keys& k, const GgufArch& arch, const GgufFile& f,
                             const GgufImportOptions& options) {
  const std::string a = std::string(arch.name) + ".";
  ModelConfig mc;
  mc.arch = arch.arch;
  if (!k.has(a + "expert_count"))
    throw Error(str("'", k.path(), "': a dense ", arch.name, " model (no GGUF key '", a,
                    "expert_count'); import-gguf reads mixture-of-experts models"));
  mc.experts = k.bounded(a + "expert_count", 1, kMaxCount);
  mc.top_k = k.bounded(a + "expert_used_count", 1, mc.experts);
  // block_count holds the multi-token-prediction layers too (llama.cpp's converter puts
  // num_nextn_predict_layers after the model's): ours are the ones before them.
  const int64_t blocks = k.bounded(a + "block_count", 1, kMaxCount);
  mc.layers = blocks - (k.has(a + "nextn_predict_layers")
                            ? k.bounded(a + "nextn_predict_layers", 0, blocks - 1)
                            : 0);
  mc.d_model = k.bounded(a + "embedding_length", 1, kMaxWidth);
  mc.heads = k.bounded(a + "attention.head_count", 1, kMaxCount);
  mc.kv_heads = k.has(a + "attention.head_count_kv") && arch.arch != Arch::deepseek_v3
                    ? k.bounded(a + "attention.head_count_kv", 1, mc.heads)
                    : mc.heads;
  // The experts' width: expert_feed_forward_length where given (the qwen
  // architectures; their feed_forward_length is the unused dense MLP's), else
  // feed_forward_length.
  const std::string ff = k.has(a + "expert_feed_forward_length") ? a + "expert_feed_forward_length"
                                                                 : a + "feed_forward_length";
  mc.d_ff = k.bounded(ff, 1, kMaxWidth);
  // The qwen architectures' dense width (HF intermediate_size), kept for export
  if (arch.arch == Arch::qwen2_moe || arch.arch == Arch::qwen3_moe) {
    const std::string key = a + "feed_forward_length";
    const int64_t Fd = k.has(key) ? k.bounded(key, 1, kMaxWidth) : mc.d_ff;
    mc.dense_ff = Fd != mc.d_ff ? Fd : 0;
  }
  if (arch.arch == Arch::qwen2_moe)
    mc.shared_expert_ff = k.bounded(a + "expert_shared_feed_forward_length", 1, kMaxWidth);
  else if (k.integer_or(a + "expert_shared_feed_forward_length", 0) != 0)
    throw Error(str("'", k.path(), "': a shared expert (GGUF key '", a,
                    "expert_shared_feed_forward_length') is not supported in ", arch.name));
  if (arch.arch == Arch::deepseek_v3)
    gguf::deepseek2_attention_config(k, mc);
  else
    head_config(k, arch, mc);
  // V: vocab_size, which llama.cpp's converter may leave out (then the tokens,
  // or the embedding).
  if (k.has(a + "vocab_size"))
    mc.vocab_size = k.bounded(a + "vocab_size", 1, kMaxWidth);
  else if (k.has("tokenizer.ggml.tokens"))
    mc.vocab_size = static_cast<int64_t>(k.strings("tokenizer.ggml.tokens").size());
  else
    mc.vocab_size = f.tensor("token_embd.weight").dims.back();
  const int64_t context = k.bounded(a + "context_length", 1, int64_t(1) << 31);
  mc.seq = options.max_seq > 0 ? std::min(context, options.max_seq) : context;
  mc.norm_eps = k.real(a + "attention.layer_norm_rms_epsilon");
  if (!(mc.norm_eps > 0 && mc.norm_eps < 1))
    k.fail(a + "attention.layer_norm_rms_epsilon", str("is ", mc.norm_eps));
  mc.rope_theta = k.real_or(a + "rope.freq_base", 10000.0);
  if (!(mc.rope_theta > 0)) k.fail(a + "rope.freq_base", str("is ", mc.rope_theta));
  mc.normalize_topk = k.flag_or(a + "expert_weights_norm", arch.normalize_topk);
  mc.moe_every = 1;
  mc.capacity_factor = 0;  // llama.cpp's MoE layers are dropless
  mc.aux_loss_coef = 0;
  mc.z_loss_coef = 0;
  mc.router_jitter = 0;
  refuse_unsupported(k, arch.name, mc.seq);
  yarn_config(k, arch.name, mc);
  if (arch.arch == Arch::glm4_moe)
    glm4moe_config(k, f, mc);
  else if (arch.arch == Arch::deepseek_v3)
    gguf::deepseek2_config(k, mc);
  else if (arch.arch == Arch::gpt_oss)
    gguf::gpt_oss_config(k, mc);
  else
    mc.experts_per_layer.assign(static_cast<size_t>(mc.layers), mc.experts);
  // No output.weight: llama.cpp's head is then token_embd (a tied head, as the converter writes a
  // tie_word_embeddings model).
  mc.tie_embeddings = std::none_of(f.tensors.begin(), f.tensors.end(), [](const GgufTensorInfo& t) {
    return t.name == "output.weight";
  });
  return mc;
}

// ---- tensors
// -----------------------------------------------------------------------------------

// expected_tensors' list, in order: llama.cpp's name, ours, our shape.
struct ExpectedTensors {
  bool permute_qk;
  std::vector<GgufTensorPlan> out;
  void add(std::string gguf, std::string ours, Shape shape, bool expert = false,
           int64_t rope_heads = 0) {
    GgufTensorPlan t;
    t.gguf = std::move(gguf);
    t.ours = std::move(ours);
    t.shape = std::move(shape);
    t.expert = expert;
    t.rope_heads = permute_qk ? rope_heads : 0;
    out.push_back(std::move(t));
  }
};

// Block i's attention, as our attention creates it: each projection's weight then its bias, then
// the qk-norms.
void expected_attention(const ModelConfig& mc, const Flavour& flavour, int64_t i,
                        ExpectedTensors& t) {
  const int64_t D = mc.d_model, H = mc.heads, KV = mc.kv_heads_resolved(),
                hd = mc.head_dim_resolved();
  const std::string blk = str("blk.", i, "."), b = str("blocks.", i, ".");
  const bool bias = flavour.qkv_bias || flavour.bias;  // gpt-oss: o too, and the experts
  if (flavour.latent_attention) {
    gguf::deepseek2_attention_tensors(mc, i, t.out);
  } else {
    t.add(blk + "attn_q.weight", b + "attn.q.weight", {H * hd, D}, false, H);
    if (bias) t.add(blk + "attn_q.bias", b + "attn.q.bias", {H * hd});
    t.add(blk + "attn_k.weight", b + "attn.k.weight", {KV * hd, D}, false, KV);
    if (bias) t.add(blk + "attn_k.bias", b + "attn.k.bias", {KV * hd});
    t.add(blk + "attn_v.weight", b + "attn.v.weight", {KV * hd, D});
    if (bias) t.add(blk + "attn_v.bias", b + "attn.v.bias", {KV * hd});
    t.add(blk + "attn_output.weight", b + "attn.o.weight", {D, H * hd});
    if (flavour.bias) t.add(blk + "attn_output.bias", b + "attn.o.bias", {D});
    if (flavour.sinks) t.add(blk + "attn_sinks.weight", b + "attn.sinks", {H});
  }
  if (flavour.qk_norm != nn::QkNorm::none) {
    const bool head = flavour.qk_norm == nn::QkNorm::head;
    t.add(blk + "attn_q_norm.weight", b + "attn.q_norm.weight", {head ? hd : H * hd});
    t.add(blk + "attn_k_norm.weight", b + "attn.k_norm.weight", {head ? hd : KV * hd});
  }
}

// MoE block i: the router, the experts (gpt-oss's biases too), the shared expert and its gate.
void expected_moe(const ModelConfig& mc, const Flavour& flavour, int64_t i, ExpectedTensors& t) {
  const int64_t D = mc.d_model, F = mc.d_ff, Fs = mc.shared_expert_ff;
  const int64_t E = mc.experts_per_layer.at(static_cast<size_t>(i));
  const std::string blk = str("blk.", i, "."), b = str("blocks.", i, ".");
  t.add(blk + "ffn_gate_inp.weight", b + "moe.router.weight", {E, D});
  if (flavour.router_bias) t.add(blk + "exp_probs_b.bias", b + "moe.router.bias", {E});
  if (flavour.router_logit_bias) t.add(blk + "ffn_gate_inp.bias", b + "moe.router.logit_bias", {E});
  t.add(blk + "ffn_gate_exps.weight", b + "moe.experts.w1", {E, F, D}, true);
  t.add(blk + "ffn_down_exps.weight", b + "moe.experts.w2", {E, D, F}, true);
  t.add(blk + "ffn_up_exps.weight", b + "moe.experts.w3", {E, F, D}, true);
  if (flavour.bias) {  // gpt-oss's expert biases
    t.add(blk + "ffn_gate_exps.bias", b + "moe.experts.b1", {E, F}, true);
    t.add(blk + "ffn_down_exps.bias", b + "moe.experts.b2", {E, D}, true);
    t.add(blk + "ffn_up_exps.bias", b + "moe.experts.b3", {E, F}, true);
  }
  if (Fs > 0) {  // the shared expert, then its gate (qwen2moe's; glm4moe's has none)
    t.add(blk + "ffn_gate_shexp.weight", b + "moe.shared.w1", {Fs, D});
    t.add(blk + "ffn_down_shexp.weight", b + "moe.shared.w2", {D, Fs});
    t.add(blk + "ffn_up_shexp.weight", b + "moe.shared.w3", {Fs, D});
    if (flavour.shared_expert_gate)
      t.add(blk + "ffn_gate_inp_shexp.weight", b + "moe.shared_gate.weight", {1, D});
  }
}

// Our parameters in our model's order, each with llama.cpp's name (io/gguf_write.cpp's table).
// An MoE layer's tensors are sized by its own expert count (experts_per_layer).
std::vector<GgufTensorPlan> expected_tensors(const ModelConfig& mc, bool permute_qk) {
  const int64_t V = mc.vocab_size, D = mc.d_model, Fd = mc.dense_ff_resolved();
  const Flavour flavour = flavour_of(mc);
  const bool post = mc.arch == Arch::glm4_moe || mc.arch == Arch::gpt_oss;  // post_attention_norm
  ExpectedTensors t{permute_qk, {}};
  t.add("token_embd.weight", "embed.tokens", {V, D});
  for (int64_t i = 0; i < mc.layers; ++i) {
    const std::string blk = str("blk.", i, "."), b = str("blocks.", i, ".");
    t.add(blk + "attn_norm.weight", b + "norm1.weight", {D});
    t.add(blk + (post ? "post_attention_norm.weight" : "ffn_norm.weight"), b + "norm2.weight", {D});
    expected_attention(mc, flavour, i, t);
    if (mc.is_moe_layer(i)) {
      expected_moe(mc, flavour, i, t);
    } else {  // glm4moe's and deepseek2's leading dense layers
      t.add(blk + "ffn_gate.weight", b + "mlp.w1", {Fd, D});
      t.add(blk + "ffn_down.weight", b + "mlp.w2", {D, Fd});
      t.add(blk + "ffn_up.weight", b + "mlp.w3", {Fd, D});
    }
  }
  t.add("output_norm.weight", "final_norm.weight", {D});
  if (!mc.tie_embeddings) t.add("output.weight", "lm_head.weight", {V, D});
  return std::move(t.out);
}

// Dimensions without trailing 1s (ggml pads them to 4 with 1s; [1, D] is
// llama.cpp's {D}).
std::vector<int64_t> trimmed(std::vector<int64_t> dims) {
  while (dims.size() > 1 && dims.back() == 1) dims.pop_back();
  return dims;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "{";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "}";
}

// Why a tensor we have no place for is there, when we know.
std::string unknown_tensor(const std::string& path, const std::string& name) {
  static const std::regex per_expert(R"(blk\.\d+\.ffn_(gate|up|down)\.\d+\.weight)");
  std::string why = "our model has no place for it";
  if (name == "rope_freqs.weight") why = "RoPE frequency scaling is not supported";
  if (std::regex_match(name, per_expert))
    why =
        "per-expert tensors of llama.cpp files before 2024 are not read: "
        "convert the model again";
  return str("'", path, "': GGUF tensor '", name, "': ", why);
}

// Whether `name` is a tensor of block `first` or a later one (blk.<i>.*, i >= first).
bool block_from(const std::string& name, int64_t first) {
  static const std::regex block(R"(blk\.(\d{1,9})\..*)");
  std::smatch m;
  return std::regex_match(name, m, block) && std::stoll(m[1].str()) >= first;
}

// Each expected tensor found in the file with the dimensions the config implies
// (a missing output.weight is llama.cpp's tied head: config_from_keys ties ours, and plans none);
// every file tensor used but those of the `skipped` multi-token-prediction layers after the
// model's `layers` (skipped, and said so).
void match_tensors(const GgufFile& f, std::vector<GgufTensorPlan>& plan, int64_t layers,
                   int64_t skipped, GgufImportReport& rep) {
  std::map<std::string, const GgufTensorInfo*> infos;
  for (const GgufTensorInfo& t : f.tensors)
    if (!infos.emplace(t.name, &t).second)
      throw Error(str("'", f.path, "': GGUF tensor '", t.name, "' is in the file twice"));
  std::set<std::string> used;
  for (GgufTensorPlan& t : plan) {
    auto it = infos.find(t.gguf);
    if (it == infos.end())
      throw Error(str("'", f.path, "': no GGUF tensor '", t.gguf, "' (our ", t.ours,
                      "): the file is incomplete"));
    const Shape& file_shape = t.file_shape.empty() ? t.shape : t.file_shape;
    std::vector<int64_t> want(file_shape.rbegin(), file_shape.rend());
    if (trimmed(it->second->dims) != trimmed(want))
      throw Error(str("'", f.path, "': GGUF tensor '", t.gguf, "' is ", dims_text(it->second->dims),
                      ", but the keys imply ", dims_text(want), " (our ", t.ours, " ",
                      shape_str(t.shape), ")"));
    used.insert(t.gguf);
    rep.mapped.push_back(str(t.gguf, " -> ", t.ours,
                             t.rope_heads || !t.rows.empty() ? " (rows un-permuted)"
                             : t.head_transpose              ? " (heads transposed)"
                                                             : ""));
  }
  int64_t skipped_tensors = 0;
  for (const GgufTensorInfo& t : f.tensors) {
    if (used.count(t.name)) continue;
    if (skipped == 0 || !block_from(t.name, layers) || block_from(t.name, layers + skipped))
      throw Error(unknown_tensor(f.path, t.name));
    ++skipped_tensors;
  }
  // As import-hf skips them (io/hf_checkpoint.cpp): transformers does not run them either.
  if (skipped > 0)
    rep.notes.push_back(str("multi-token-prediction layers (blk.", layers, "..",
                            layers + skipped - 1, ", nextn_predict_layers): ", skipped_tensors,
                            " tensors skipped: next-token scoring does not use them"));
}

// A weight matrix the checkpoint may hold in blocks, as quantize decides (a single row, Qwen2-MoE's
// shared-expert gate, is a vector in all but shape: kept wide).
bool block_weight(const GgufTensorPlan& t) {
  return quantizable(t.ours, t.shape) && t.shape[t.shape.size() - 2] > 1;
}

// A 4- or 6-bit tensor where our model computes in floats (norms, biases, the router): llama.cpp
// never writes one, and dequantising it would change the products llama.cpp forms: refused. The
// embedding is the exception: llama.cpp's row lookup dequantises it, as we do once.
void refuse_wide_blocks(const GgufFile& f, const std::vector<GgufTensorPlan>& plan) {
  for (const GgufTensorPlan& t : plan) {
    const GgufType type = f.tensor(t.gguf).type;
    if (!is_block_type(type) || block_weight(t) || t.ours == "embed.tokens") continue;
    throw Error(str("'", f.path, "': GGUF tensor '", t.gguf, "' is ", gguf_type_name(type),
                    ", but our ", t.ours,
                    " is computed in floats (only weight matrices and the "
                    "token embedding may be block-quantised): not imported, as its products "
                    "would differ from llama.cpp's"));
  }
}

// The recipe a set of block formats makes: quantize's name for the mixes it makes, else "mixed".
std::string recipe_of(const std::set<std::string>& formats) {
  if (formats.size() == 1 && *formats.begin() != "q8_0") return *formats.begin();
  if (formats == std::set<std::string>{"q4_k", "q6_k"}) return "q4_k_m";
  // llama.cpp's MOSTLY_MXFP4_MOE (experts mxfp4, other matrices q8_0): quantize's mxfp4 recipe.
  if (formats == std::set<std::string>{"mxfp4", "q8_0"}) return "mxfp4";
  return kMixedRecipe;
}

// A file with 4- or 6-bit weight matrices: every weight matrix the file holds in blocks (q8_0
// among them) keeps its bytes (tensor_formats); the others keep their floats, as does deepseek2's
// attn_k_b, transposed per head (gguf_import_deepseek2.h). Returns the recipe.
std::string plan_blocks(const GgufFile& f, std::vector<GgufTensorPlan>& plan,
                        nlohmann::json& formats) {
  std::set<std::string> used;
  formats = nlohmann::json::object();
  for (GgufTensorPlan& t : plan) {
    const GgufType type = f.tensor(t.gguf).type;
    if (!is_blocked(type) || !block_weight(t) || t.head_transpose) continue;
    t.block_format = cpu::block_format_name(block_format_of(type));
    formats[t.ours] = t.block_format;
    used.insert(t.block_format);
  }
  return recipe_of(used);
}

// The checkpoint's quantisation recipe ("" for none): a block recipe when a weight matrix is in a
// 4- or 6-bit type (plan_blocks); else "q8_0" when one is in q8_0, every weight matrix then our
// Q8_0 rows as moe-convert quantize would store them.
std::string plan_quantization(const GgufFile& f, std::vector<GgufTensorPlan>& plan,
                              nlohmann::json& formats, GgufImportReport& rep) {
  bool q8 = false;
  for (const GgufTensorPlan& t : plan) {
    const GgufType type = f.tensor(t.gguf).type;
    if (is_block_type(type) && block_weight(t) && !t.head_transpose)
      return plan_blocks(f, plan, formats);
    q8 |= quantizable(t.ours, t.shape) && type == GgufType::q8_0 && !t.head_transpose;
  }
  if (!q8) return "";
  for (GgufTensorPlan& t : plan) {
    t.q8_rows = quantizable(t.ours, t.shape) && !t.head_transpose;
    if (t.q8_rows && f.tensor(t.gguf).type != GgufType::q8_0)
      rep.notes.push_back(str(t.gguf, " (", gguf_type_name(f.tensor(t.gguf).type),
                              ") quantised to Q8_0 as moe-convert quantize would"));
  }
  return "q8_0";
}

bool exact_in(const std::vector<float>& values, DType dtype) {
  for (float v : values) {
    const float back = dtype == DType::f16 ? kernels::f16_to_f32(kernels::f32_to_f16(v))
                                           : kernels::bf16_to_f32(kernels::f32_to_bf16(v));
    if (!(back == v)) return false;
  }
  return true;
}

DType dtype_of(GgufType t) {
  return t == GgufType::f16 ? DType::f16 : t == GgufType::bf16 ? DType::bf16 : DType::f32;
}

// The router's selection bias (glm4moe's exp_probs_b) and gpt-oss's attention sinks: f32
// whatever the model's dtype, as nn::Router and nn::Attention store them.
bool always_f32(const GgufTensorPlan& t) {
  for (const std::string suffix : {".router.bias", ".attn.sinks"})
    if (t.ours.size() > suffix.size() &&
        t.ours.compare(t.ours.size() - suffix.size(), suffix.size(), suffix) == 0)
      return true;
  return false;
}

// The dtype a tensor is stored in when it keeps no blocks: the model's, or f32 (always_f32).
DType stored_dtype(const GgufTensorPlan& t, DType model) {
  return always_f32(t) ? DType::f32 : model;
}

// The stored dtype: the 16-bit type of the 16-bit tensors when every other
// tensor we keep unquantised holds only values it represents exactly, else f32
// (exact for every type we read).
DType choose_dtype(const GgufFile& f, const std::vector<GgufTensorPlan>& plan,
                   GgufImportReport& rep) {
  std::set<GgufType> halves;
  for (const GgufTensorPlan& t : plan)
    if (!t.q8_rows && t.block_format.empty() &&
        (f.tensor(t.gguf).type == GgufType::f16 || f.tensor(t.gguf).type == GgufType::bf16))
      halves.insert(f.tensor(t.gguf).type);
  if (halves.empty()) return DType::f32;
  if (halves.size() > 1) {
    rep.notes.push_back("f16 and bf16 tensors: every parameter stored f32 (exact)");
    return DType::f32;
  }
  const DType half = dtype_of(*halves.begin());
  for (const GgufTensorPlan& t : plan) {
    const GgufTensorInfo& info = f.tensor(t.gguf);
    if (t.q8_rows || !t.block_format.empty() || always_f32(t) || info.type == *halves.begin())
      continue;
    if (!exact_in(read_gguf_tensor(f, t.gguf), half)) {
      rep.notes.push_back(str(t.gguf, " (", gguf_type_name(info.type), ") holds values ",
                              dtype_name(half), " cannot: every parameter stored f32 (exact)"));
      return DType::f32;
    }
  }
  return half;
}

// Rows of `row_bytes` bytes of `heads` q/k heads of hd rows, from llama.cpp's
// order back to ours: our row j hd/2 + i of a head is the file's row 2i + j (j
// = 0, 1; io/gguf_write.cpp).
void unpermute_rows(std::vector<uint8_t>& bytes, int64_t heads, int64_t hd, size_t row_bytes) {
  const std::vector<uint8_t> file = bytes;
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(bytes.data() + static_cast<size_t>(h * hd + j * half + i) * row_bytes,
                    file.data() + static_cast<size_t>(h * hd + 2 * i + j) * row_bytes, row_bytes);
}

// Our Q8_0 rows of values (a matrix the file holds in another type): what
// quantize would store.
std::vector<uint8_t> quantized_rows(const std::string& where, const std::vector<float>& values,
                                    int64_t rows, int64_t in) {
  const int64_t row_bytes = cpu::q8_row_bytes(in);
  std::vector<uint8_t> out(static_cast<size_t>(rows * row_bytes));
  for (int64_t r = 0; r < rows; ++r) {
    try {
      cpu::quantize_q8_0_row(values.data() + r * in, in, out.data() + r * row_bytes);
    } catch (const Error& e) {
      throw Error(str(where, ", row ", r, ": ", e.what()));
    }
  }
  return out;
}

Tensor tensor_of(const Shape& shape, DType dtype, const std::vector<uint8_t>& bytes) {
  Tensor t = Tensor::empty(shape, dtype);
  MOE_CHECK(t.nbytes() == bytes.size(), "GGUF import: ", bytes.size(), " bytes for ",
            shape_str(shape));
  std::memcpy(t.raw(), bytes.data(), bytes.size());
  return t;
}

// The stored shape of a tensor kept in blocks: u8 [.., out, row bytes].
Shape block_shape(const GgufTensorPlan& t) {
  Shape shape = t.shape;
  shape.back() = cpu::block_row_bytes(cpu::parse_block_format(t.block_format), shape.back());
  return shape;
}

// A tensor kept in its blocks: the file's bytes, q/k rows un-permuted as whole rows of blocks
// (rows are quantised independently). Every block's scales are checked first, as the loader
// checks them (a q8_0 block as q8_blocks_to_rows does): a damaged file is refused here, by name.
Tensor block_tensor(const GgufFile& f, const GgufTensorPlan& t, int64_t hd) {
  const std::string where = str("'", f.path, "': GGUF tensor '", t.gguf, "'");
  const cpu::BlockFormat format = cpu::parse_block_format(t.block_format);
  const int64_t in = t.shape.back(), rows = shape_numel(t.shape) / in;
  const int64_t row_bytes = cpu::block_row_bytes(format, in), bytes_per = cpu::block_bytes(format);
  std::vector<uint8_t> bytes = read_gguf_tensor_bytes(f, t.gguf);
  if (!t.rows.empty()) bytes = gguf::pick_row_bytes(bytes, t.rows, size_t(row_bytes));
  if (format == cpu::BlockFormat::q8_0) {
    (void)q8_blocks_to_rows(where, bytes.data(), rows, in);
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < row_bytes / bytes_per; ++b) {
        float second = 0;
        const float scale =
            cpu::block_scale(format, bytes.data() + r * row_bytes + b * bytes_per, &second);
        if (!std::isfinite(scale) || !std::isfinite(second))
          throw Error(str(where, ": row ", r, ", block ", b, ": a scale is not finite (",
                          std::isfinite(scale) ? second : scale, "): the file is damaged"));
      }
  }
  if (t.rope_heads) unpermute_rows(bytes, t.rope_heads, hd, size_t(row_bytes));
  return tensor_of(block_shape(t), DType::u8, bytes);
}

}  // namespace

GgufImportPlan plan_gguf_import(const std::string& path, const GgufImportOptions& options,
                                GgufImportReport* report) {
  GgufImportReport local;
  GgufImportReport& rep = report ? *report : local;
  rep = GgufImportReport{};
  GgufImportPlan plan;
  plan.file = read_gguf(path);
  const Keys k(plan.file);
  const GgufArch& arch = arch_of(k);
  rep.architecture = arch.name;
  rep.family = arch_name(arch.arch);
  ModelConfig mc = config_from_keys(k, arch, plan.file, options);
  const int64_t context = k.integer(str(arch.name, ".context_length"));
  gguf::adopt_record(k, mc, rep);
  if (mc.seq < context)
    rep.notes.push_back(str("context (seq) ", mc.seq, " of context_length ", context));
  plan.tensors = expected_tensors(mc, arch.permute_qk);
  if (mc.tie_embeddings)
    rep.notes.push_back("no output.weight: the LM head is the token embedding (tied)");
  const int64_t skipped = k.integer(str(arch.name, ".block_count")) - mc.layers;
  match_tensors(plan.file, plan.tensors, mc.layers, skipped, rep);
  refuse_wide_blocks(plan.file, plan.tensors);
  nlohmann::json formats;
  rep.recipe = plan_quantization(plan.file, plan.tensors, formats, rep);
  gguf::note_dequantised(plan.file, plan.tensors, rep);
  rep.quantized = !rep.recipe.empty();
  mc.dtype = choose_dtype(plan.file, plan.tensors, rep);
  plan.config = mc;
  plan.model_config = to_json(mc);
  if (rep.quantized) plan.model_config[kQuantizationKey] = rep.recipe;
  if (!formats.empty()) plan.model_config[kTensorFormatsKey] = formats;
  plan.tokenizer = gguf::tokenizer_from_gguf(k, mc.vocab_size, rep.notes);
  return plan;
}

NamedTensor import_gguf_tensor(const GgufImportPlan& plan, const GgufTensorPlan& t) {
  const GgufFile& f = plan.file;
  const GgufTensorInfo& info = f.tensor(t.gguf);
  const std::string where = str("'", f.path, "': GGUF tensor '", t.gguf, "'");
  const int64_t in = t.shape.back(), rows = info.numel() / in;
  const int64_t hd = plan.config.head_dim_resolved();
  Tensor out;
  const bool floats = t.block_format.empty() && !t.q8_rows;
  if (floats && (!t.rows.empty() || t.head_transpose)) {  // deepseek2's latent attention
    out = Tensor::from_vector(t.shape, gguf::deepseek2_values(t, read_gguf_tensor(f, t.gguf)));
    out = out.to(stored_dtype(t, plan.config.dtype));
    check_finite(str("'", f.path, "'"), t.gguf, out);
  } else if (!t.block_format.empty()) {
    out = block_tensor(f, t, hd);
  } else if (t.q8_rows) {
    std::vector<uint8_t> bytes;
    if (info.type == GgufType::q8_0) {
      bytes = q8_blocks_to_rows(where, read_gguf_tensor_bytes(f, t.gguf).data(), rows, in);
    } else {
      std::vector<float> values = read_gguf_tensor(f, t.gguf);
      check_finite(str("'", f.path, "'"), t.gguf, Tensor::from_vector({info.numel()}, values));
      bytes = quantized_rows(where, values, rows, in);
    }
    if (t.rope_heads) unpermute_rows(bytes, t.rope_heads, hd, size_t(cpu::q8_row_bytes(in)));
    if (!t.rows.empty()) bytes = gguf::pick_row_bytes(bytes, t.rows, size_t(cpu::q8_row_bytes(in)));
    Shape shape = t.shape;
    shape.back() = cpu::q8_row_bytes(in);
    out = tensor_of(shape, DType::u8, bytes);
  } else {
    const DType dtype = stored_dtype(t, plan.config.dtype);
    if (dtype_of(info.type) == dtype && !is_blocked(info.type)) {  // bitwise
      std::vector<uint8_t> bytes = read_gguf_tensor_bytes(f, t.gguf);
      if (t.rope_heads) unpermute_rows(bytes, t.rope_heads, hd, size_t(in) * dtype_size(dtype));
      out = tensor_of(t.shape, dtype, bytes);
    } else {  // converted exactly (choose_dtype), or dequantised
      out = Tensor::from_vector(t.shape, read_gguf_tensor(f, t.gguf));
      if (t.rope_heads) {
        std::vector<uint8_t> bytes(static_cast<const uint8_t*>(out.raw()),
                                   static_cast<const uint8_t*>(out.raw()) + out.nbytes());
        unpermute_rows(bytes, t.rope_heads, hd, size_t(in) * 4);
        std::memcpy(out.raw(), bytes.data(), bytes.size());
      }
      out = out.dtype() == dtype ? out : out.to(dtype);
    }
    check_finite(str("'", f.path, "'"), t.gguf, out);
  }
  out.set_name(t.ours);
  return {t.ours, std::move(out), t.expert, {}};
}

Checkpoint import_gguf(const std::string& path, const GgufImportOptions& options,
                       GgufImportReport* report) {
  auto shared = std::make_shared<const GgufImportPlan>(plan_gguf_import(path, options, report));
  const GgufImportPlan& plan = *shared;
  Checkpoint ckpt;
  for (const GgufTensorPlan& t : plan.tensors) {  // deferred: read when written (hold_all)
    auto source = std::make_shared<TensorSource>();
    source->shape = t.shape;
    source->dtype = stored_dtype(t, plan.config.dtype);
    if (t.q8_rows) {
      source->shape.back() = cpu::q8_row_bytes(t.shape.back());
      source->dtype = DType::u8;
    } else if (!t.block_format.empty()) {
      source->shape = block_shape(t);
      source->dtype = DType::u8;
    }
    source->read = [shared, t] { return import_gguf_tensor(*shared, t).tensor; };
    NamedTensor nt{t.ours, Tensor(), t.expert, {}};
    nt.deferred = std::move(source);
    ckpt.params.push_back(std::move(nt));
  }
  ckpt.model_config = plan.model_config;
  ckpt.train_config = nullptr;
  ckpt.tokenizer = plan.tokenizer;
  ckpt.provenance = options.provenance;
  if (ckpt.provenance.tool.empty())
    ckpt.provenance =
        Provenance{"libmoe import_gguf", version(), git_revision(), "", utc_timestamp()};
  if (ckpt.provenance.time.empty()) ckpt.provenance.time = utc_timestamp();
  return ckpt;
}

}  // namespace moe::io
