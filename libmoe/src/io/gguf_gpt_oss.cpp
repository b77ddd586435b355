// GGUF export of gpt_oss models (OpenAI gpt-oss-20b / -120b) as llama.cpp's "gpt-oss"
// architecture (see io/gguf_writer.h): what that architecture's graph hard-codes, refused by name
// when a model differs; the tensors gpt-oss has beyond the others (the o bias, the attention
// sinks, the router's bias, the experts' biases); and the keys only gpt-oss reads. The rest of the
// file (embedding, norms, q/k/v with their biases, router, experts, vocabulary) is
// gguf_write.cpp's, as for qwen2moe.
// Shape letters: D hidden size, H heads, E experts of a layer, F expert hidden width.
//
// llama.cpp's gpt-oss (its converter GptOssModel, its graph for LLM_ARCH_OPENAI_MOE):
// - NEOX rope (rotates (i, i + hd/2) as we do): q/k rows go out as they are;
// - the clamped SwiGLU with alpha 1.702 and limit 7 fixed in the graph (no key);
// - softmax over the chosen experts' logits (no expert_gating_func key): our softmax over all
//   experts renormalised over the top-k (normalize_topk) is the same weights;
// - the sliding window on the even layers (0, 2, ...; no sliding_window_pattern key), the odd
//   ones attending to the whole context; attention.sliding_window its width;
// - the sink logit of each head added to the softmax's denominator (attn_sinks), unscaled.
#include "io/gguf_writer.h"
#include "moe/error.h"
#include "moe/models/flavour.h"

namespace moe::io::gguf_out {

namespace {

// llama.cpp's gpt-oss graph's SwiGLU constants (its build_moe_ffn for LLM_FFN_SWIGLU_OAI_MOE).
constexpr double kAlpha = 1.702, kLimit = 7.0;

// Whether every layer's window is the one llama.cpp's gpt-oss gives it: the even layers slide
// (when the model has a window shorter than its context), the odd ones see it all.
bool even_layers_slide(const ModelConfig& mc) {
  for (int64_t i = 0; i < mc.layers; ++i)
    if ((mc.window_of(i) > 0) != (i % 2 == 0)) return false;
  return true;
}

void check_gpt_oss_window(const ModelConfig& mc) {
  if (mc.sliding_window == 0 || mc.sliding_window >= mc.seq) return;  // nothing slides
  if (even_layers_slide(mc)) return;
  std::string layers;
  for (int64_t i = 0; i < mc.layers; ++i)
    if (mc.window_of(i) > 0) layers += str(layers.empty() ? "" : ", ", i);
  throw Error(str("GGUF export: llama.cpp's gpt-oss slides its window over the even layers (0, ",
                  "2, ...) only; this model's window of ", mc.sliding_window, " is on layers ",
                  layers));
}

// YaRN as llama.cpp runs it: betas read from the keys, the attention factor 0.1 ln(factor) + 1
// derived (transformers' default), no mscale. truncate false goes out (yarn_note).
void check_gpt_oss_yarn(const ModelConfig& mc) {
  if (mc.rope_type != RopeType::yarn) return;
  const ops::YarnSettings& y = mc.yarn;
  const char* differs = y.mscale > 0 || y.mscale_all_dim > 0 ? "mscale / mscale_all_dim"
                        : y.attention_factor > 0             ? "attention_factor"
                                                             : nullptr;
  if (differs)
    throw Error(str("GGUF export: this model's YaRN sets ", differs,
                    ", which llama.cpp's gpt-oss does not read (it derives YaRN's attention "
                    "factor from the scaling factor)"));
}

}  // namespace

void check_gpt_oss(const ModelConfig& mc) {
  if (mc.swiglu_alpha != kAlpha || mc.swiglu_limit != kLimit)
    throw Error(str("GGUF export: llama.cpp's gpt-oss fixes the clamped SwiGLU at alpha ", kAlpha,
                    " and limit ", kLimit, "; this model's are swiglu_alpha ", mc.swiglu_alpha,
                    " and swiglu_limit ", mc.swiglu_limit));
  if (mc.tie_embeddings)
    throw Error(
        "GGUF export: llama.cpp's gpt-oss reads its LM head from output.weight; this model ties "
        "the head to the token embedding (tie_embeddings)");
  const Flavour f = flavour_of(mc);
  if (!f.sinks || !f.bias || !f.router_logit_bias)
    throw Error(
        "GGUF export: llama.cpp's gpt-oss has attention sinks, biases and a router bias; this "
        "model lacks one of them");
  check_gpt_oss_window(mc);
  check_gpt_oss_yarn(mc);
}

std::string gpt_oss_yarn_note(const ModelConfig& mc) {
  if (mc.rope_type != RopeType::yarn || mc.yarn.truncate) return "";
  return "YaRN truncate false: llama.cpp floors / ceils YaRN's correction range (a few middle "
         "frequency pairs turn differently from transformers'), as in every gpt-oss GGUF";
}

void gpt_oss_layer_extras(ExportModel& m, int64_t i, std::vector<Planned>& plan) {
  const ModelConfig& mc = m.config();
  const int64_t D = mc.d_model, H = mc.heads, E = m.experts(), F = mc.d_ff;
  const std::string ours = str("blocks.", i, "."), blk = str("blk.", i, ".");
  // 1-D tensors and the experts' biases stay f32, as llama.cpp's converter keeps them.
  auto f32 = [&](const std::string& gguf, const std::string& name, const Shape& shape) {
    const NamedTensor& nt = m.param(ours + name, shape);
    std::vector<int64_t> dims(shape.rbegin(), shape.rend());
    plan.push_back({blk + gguf, std::move(dims), GgufType::f32, 1,
                    [&nt](int64_t) { return nt.whole().to_vector(); }});
  };
  f32("attn_output.bias", "attn.o.bias", {D});
  f32("attn_sinks.weight", "attn.sinks", {H});
  f32("ffn_gate_inp.bias", "moe.router.logit_bias", {E});
  f32("ffn_gate_exps.bias", "moe.experts.b1", {E, F});
  f32("ffn_down_exps.bias", "moe.experts.b2", {E, D});
  f32("ffn_up_exps.bias", "moe.experts.b3", {E, F});
}

void write_gpt_oss_keys(Header& h, const ModelConfig& mc) {
  const std::string a = "gpt-oss.";
  // A model without a window shorter than its context: a window as long as the context, which
  // masks nothing on the layers llama.cpp slides.
  const bool slides = mc.sliding_window > 0 && mc.sliding_window < mc.seq;
  h.kv_u32(a + "attention.sliding_window",
           static_cast<uint32_t>(slides ? mc.sliding_window : mc.seq));
  if (mc.rope_type != RopeType::yarn) return;
  // As the converter writes a config's beta_fast / beta_slow (gpt-oss's 32 and 1).
  h.kv_f32(a + "rope.scaling.yarn_beta_fast", static_cast<float>(mc.yarn.beta_fast));
  h.kv_f32(a + "rope.scaling.yarn_beta_slow", static_cast<float>(mc.yarn.beta_slow));
}

}  // namespace moe::io::gguf_out
