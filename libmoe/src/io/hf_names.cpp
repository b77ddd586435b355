// Hugging Face tensor names -> our slots (see io/hf_names.h).
#include "io/hf_names.h"

#include <map>
#include <optional>
#include <regex>

#include "moe/error.h"

namespace moe::io::hf {

Arch arch_of_family(const std::string& model_type, const std::string& config_path) {
  for (Arch arch : {Arch::mixtral, Arch::qwen2_moe, Arch::qwen3_moe, Arch::olmoe, Arch::glm4_moe,
                    Arch::deepseek_v3, Arch::gpt_oss})
    if (model_type == arch_name(arch)) return arch;
  if (model_type == "deepseek_v2") return Arch::deepseek_v3;  // V3's layers, softmax routing
  throw Error(str("'", config_path, "': model_type '", model_type,
                  "' is not supported (supported: deepseek_v2, deepseek_v3, glm4_moe, gpt_oss, "
                  "mixtral, olmoe, qwen2_moe, qwen3_moe)"));
}

const char* slot_feature(Slot s) {
  switch (s) {
    case Slot::q_bias:
    case Slot::k_bias:
    case Slot::v_bias:
      return "attention biases";
    case Slot::q_norm:
    case Slot::k_norm:
      return "qk-norm (self_attn.q_norm/k_norm)";
    case Slot::shared_w1:
    case Slot::shared_w2:
    case Slot::shared_w3:
    case Slot::shared_gate:
      return "shared expert";
    case Slot::router_bias:
      return "router selection bias (e_score_correction_bias)";
    case Slot::dense_w1:
    case Slot::dense_w2:
    case Slot::dense_w3:
      return "dense MLP layers";
    case Slot::mla_q_a:
    case Slot::mla_q_a_norm:
    case Slot::mla_q_b:
    case Slot::mla_kv_a:
    case Slot::mla_kv_a_norm:
    case Slot::mla_kv_b:
      return "latent attention (DeepSeek's kv_a_proj_with_mqa, ...)";
    case Slot::o_bias:
      return "attention output bias (self_attn.o_proj.bias)";
    case Slot::sinks:
      return "attention sinks (self_attn.sinks)";
    case Slot::router_logit_bias:
      return "router bias";
    case Slot::gate_up_bias:
    case Slot::down_bias:
      return "expert biases";
    case Slot::gate_up_blocks:
    case Slot::gate_up_scales:
    case Slot::down_blocks:
    case Slot::down_scales:
      return "MXFP4 experts (gpt-oss's _blocks/_scales)";
    default:
      return nullptr;
  }
}

bool flavour_has(const Flavour& flavour, Slot s) {
  switch (s) {
    case Slot::q_bias:
    case Slot::k_bias:
    case Slot::v_bias:
      return flavour.qkv_bias || flavour.bias;
    case Slot::o_bias:
    case Slot::gate_up_bias:
    case Slot::down_bias:
      return flavour.bias;
    case Slot::sinks:
      return flavour.sinks;
    case Slot::router_logit_bias:
      return flavour.router_logit_bias;
    case Slot::gate_up_blocks:  // gpt-oss's expert layout, which its clamped SwiGLU marks
    case Slot::gate_up_scales:
    case Slot::down_blocks:
    case Slot::down_scales:
      return flavour.activation == nn::Activation::swiglu_clamped;
    case Slot::q_norm:
    case Slot::k_norm:
      return flavour.qk_norm != nn::QkNorm::none;
    case Slot::shared_w1:
    case Slot::shared_w2:
    case Slot::shared_w3:
      return flavour.shared_expert_gate || flavour.ungated_shared_expert;
    case Slot::shared_gate:
      return flavour.shared_expert_gate;
    case Slot::router_bias:
      return flavour.router_bias;
    case Slot::dense_w1:
    case Slot::dense_w2:
    case Slot::dense_w3:
      return flavour.dense_layers;
    case Slot::mla_q_a:
    case Slot::mla_q_a_norm:
    case Slot::mla_q_b:
    case Slot::mla_kv_a:
    case Slot::mla_kv_a_norm:
    case Slot::mla_kv_b:
      return flavour.latent_attention;
    default:
      return true;
  }
}

namespace {

// gpt-oss's own tensors within a layer (`rest` after "model.layers.<i>."): the sinks, the router's
// logit bias, the fused experts' biases and the MXFP4 form of its fused experts.
std::optional<Slot> gpt_oss_slot(const std::string& rest) {
  static const std::regex fused_bias_re(
      R"((block_sparse_moe|mlp)\.experts\.(gate_up|down)_proj_bias)");
  static const std::regex mxfp4_re(R"(mlp\.experts\.(gate_up|down)_proj_(blocks|scales))");
  if (rest == "mlp.router.bias") return Slot::router_logit_bias;
  if (rest == "self_attn.sinks") return Slot::sinks;
  std::smatch r;
  if (std::regex_match(rest, r, fused_bias_re))
    return r[2].str() == "gate_up" ? Slot::gate_up_bias : Slot::down_bias;
  if (!std::regex_match(rest, r, mxfp4_re)) return std::nullopt;
  const bool gate_up = r[1].str() == "gate_up", blocks = r[2].str() == "blocks";
  return gate_up ? (blocks ? Slot::gate_up_blocks : Slot::gate_up_scales)
                 : (blocks ? Slot::down_blocks : Slot::down_scales);
}

}  // namespace

Classified classify(const std::string& name) {
  static const std::regex layer_re(R"(model\.layers\.(\d+)\.(.+))");
  static const std::regex attn_re(R"(self_attn\.(q|k|v|o)_proj\.weight)");
  static const std::regex attn_bias_re(R"(self_attn\.(q|k|v|o)_proj\.bias)");
  static const std::regex qk_norm_re(R"(self_attn\.(q_norm|k_norm)\.weight)");
  static const std::regex router_re(R"((block_sparse_moe|mlp)\.(gate|router)\.weight)");
  static const std::regex router_bias_re(
      R"((block_sparse_moe|mlp)\.gate\.(bias|e_score_correction_bias))");
  static const std::regex expert_re(
      R"((block_sparse_moe|mlp)\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight)");
  static const std::regex expert_bias_re(
      R"((block_sparse_moe|mlp)\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.bias)");
  static const std::regex fused_re(R"((block_sparse_moe|mlp)\.experts\.(gate_up_proj|down_proj))");
  static const std::regex qwen_shared_re(
      R"(mlp\.shared_experts?\.(gate_proj|up_proj|down_proj)\.weight)");
  static const std::regex shared_re(R"(mlp\.shared_experts?(_gate)?\..+)");
  static const std::regex dense_re(R"(mlp\.(gate_proj|up_proj|down_proj)\.(weight|bias))");
  Classified c;
  if (name == "model.embed_tokens.weight") {
    c.kind = Classified::mapped;
    c.our = "embed.tokens";
    return c;
  }
  if (name == "model.norm.weight") {
    c.kind = Classified::mapped;
    c.our = "final_norm.weight";
    return c;
  }
  if (name == "lm_head.weight") {
    c.kind = Classified::mapped;
    c.our = "lm_head.weight";
    return c;
  }
  if (name == "model.rotary_emb.inv_freq") {
    c.kind = Classified::derived;
    return c;
  }
  std::smatch m;
  if (!std::regex_match(name, m, layer_re)) return c;
  const std::string layer_text = m[1].str();
  if (layer_text.size() > 9) return c;
  c.layer = std::stoll(layer_text);
  const std::string rest = m[2].str();
  std::smatch r;
  auto mapped = [&](Slot slot) {
    c.kind = Classified::mapped;
    c.slot = slot;
    return c;
  };
  auto unsupported = [&](const char* feature) {
    c.kind = Classified::unsupported;
    c.feature = feature;
    return c;
  };
  if (rest == "input_layernorm.weight") return mapped(Slot::norm1);
  if (rest == "post_attention_layernorm.weight") return mapped(Slot::norm2);
  if (rest == "self_attn.rotary_emb.inv_freq") {
    c.kind = Classified::derived;
    return c;
  }
  if (std::regex_match(rest, r, attn_re)) {
    const char p = r[1].str()[0];
    return mapped(p == 'q' ? Slot::q : p == 'k' ? Slot::k : p == 'v' ? Slot::v : Slot::o);
  }
  if (std::regex_match(rest, r, attn_bias_re)) {
    const char p = r[1].str()[0];
    if (p == 'o') return mapped(Slot::o_bias);
    return mapped(p == 'q' ? Slot::q_bias : p == 'k' ? Slot::k_bias : Slot::v_bias);
  }
  static const std::map<std::string, Slot> latent = {
      {"self_attn.q_a_proj.weight", Slot::mla_q_a},
      {"self_attn.q_a_layernorm.weight", Slot::mla_q_a_norm},
      {"self_attn.q_b_proj.weight", Slot::mla_q_b},
      {"self_attn.kv_a_proj_with_mqa.weight", Slot::mla_kv_a},
      {"self_attn.kv_a_layernorm.weight", Slot::mla_kv_a_norm},
      {"self_attn.kv_b_proj.weight", Slot::mla_kv_b}};
  if (auto it = latent.find(rest); it != latent.end()) return mapped(it->second);
  if (std::regex_match(rest, r, qk_norm_re))
    return mapped(r[1].str() == "q_norm" ? Slot::q_norm : Slot::k_norm);
  if (std::regex_match(rest, router_re)) return mapped(Slot::router);
  if (rest == "mlp.gate.e_score_correction_bias") return mapped(Slot::router_bias);
  if (std::optional<Slot> slot = gpt_oss_slot(rest)) return mapped(*slot);
  if (std::regex_match(rest, router_bias_re)) return unsupported("router bias");
  if (std::regex_match(rest, r, expert_re)) {
    const std::string e = r[2].str();
    if (e.size() > 9) return Classified{};
    c.expert = std::stoll(e);
    const std::string w = r[3].str();
    if (w == "w1" || w == "gate_proj") return mapped(Slot::w1);
    if (w == "w3" || w == "up_proj") return mapped(Slot::w3);
    return mapped(Slot::w2);
  }
  if (std::regex_match(rest, expert_bias_re)) return unsupported("expert biases");
  if (std::regex_match(rest, r, fused_re))
    return mapped(r[2].str() == "gate_up_proj" ? Slot::gate_up : Slot::down);
  if (std::regex_match(rest, r, qwen_shared_re)) {
    const std::string w = r[1].str();
    return mapped(w == "gate_proj" ? Slot::shared_w1
                  : w == "up_proj" ? Slot::shared_w3
                                   : Slot::shared_w2);
  }
  if (rest == "mlp.shared_expert_gate.weight") return mapped(Slot::shared_gate);
  if (std::regex_match(rest, shared_re)) return unsupported("shared expert");
  if (std::regex_match(rest, r, dense_re)) {
    if (r[2].str() == "bias") return unsupported("dense MLP biases");
    const std::string w = r[1].str();
    return mapped(w == "gate_proj" ? Slot::dense_w1
                  : w == "up_proj" ? Slot::dense_w3
                                   : Slot::dense_w2);
  }
  return Classified{};
}

const char* slot_name(Slot s) {
  switch (s) {
    case Slot::norm1:
      return "norm1.weight";
    case Slot::norm2:
      return "norm2.weight";
    case Slot::q:
      return "attn.q.weight";
    case Slot::k:
      return "attn.k.weight";
    case Slot::v:
      return "attn.v.weight";
    case Slot::o:
      return "attn.o.weight";
    case Slot::q_bias:
      return "attn.q.bias";
    case Slot::k_bias:
      return "attn.k.bias";
    case Slot::v_bias:
      return "attn.v.bias";
    case Slot::q_norm:
      return "attn.q_norm.weight";
    case Slot::k_norm:
      return "attn.k_norm.weight";
    case Slot::router:
      return "moe.router.weight";
    case Slot::w1:
      return "moe.experts.w1";
    case Slot::w2:
      return "moe.experts.w2";
    case Slot::w3:
      return "moe.experts.w3";
    case Slot::gate_up:
      return "moe.experts.w1+w3";
    case Slot::down:
      return "moe.experts.w2";
    case Slot::shared_w1:
      return "moe.shared.w1";
    case Slot::shared_w2:
      return "moe.shared.w2";
    case Slot::shared_w3:
      return "moe.shared.w3";
    case Slot::shared_gate:
      return "moe.shared_gate.weight";
    case Slot::router_bias:
      return "moe.router.bias";
    case Slot::dense_w1:
      return "mlp.w1";
    case Slot::dense_w2:
      return "mlp.w2";
    case Slot::dense_w3:
      return "mlp.w3";
    case Slot::mla_q_a:
      return "attn.q_a.weight";
    case Slot::mla_q_a_norm:
      return "attn.q_a_norm.weight";
    case Slot::mla_q_b:
      return "attn.q_b.weight";
    case Slot::mla_kv_a:
      return "attn.kv_a.weight+k_rope.weight";
    case Slot::mla_kv_a_norm:
      return "attn.kv_a_norm.weight";
    case Slot::mla_kv_b:
      return "attn.k_b.weight+v_b.weight";
    case Slot::o_bias:
      return "attn.o.bias";
    case Slot::sinks:
      return "attn.sinks";
    case Slot::router_logit_bias:
      return "moe.router.logit_bias";
    case Slot::gate_up_bias:
      return "moe.experts.b1+b3";
    case Slot::down_bias:
      return "moe.experts.b2";
    case Slot::gate_up_blocks:
    case Slot::gate_up_scales:
      return "moe.experts.w1+w3";
    case Slot::down_blocks:
    case Slot::down_scales:
      return "moe.experts.w2";
  }
  return "?";
}

}  // namespace moe::io::hf
