// GGUF export of deepseek_v3 models (DeepSeek-V2, V2-Lite, V3, R1, Kimi K2) as llama.cpp's
// "deepseek2" architecture (see io/gguf_writer.h): the latent attention's tensors under
// llama.cpp's names and the keys only deepseek2 reads. The rest of the file (embedding, norms,
// dense layers, experts, shared experts, the selection bias exp_probs_b, the vocabulary) is
// gguf_write.cpp's, as for glm4moe.
// Shape letters: D hidden size, H heads, r q_lora_rank, c kv_lora_rank, dn qk_nope_dim,
// dr qk_rope_dim, dv v_head_dim, F expert hidden width, Fs shared expert hidden width.
//
// RoPE pairs. DeepSeek's own checkpoints (and HF's, rope_interleave true) hold the rope features
// of q_b_proj / q_proj / kv_a_proj_with_mqa in interleaved pairs: features (2i, 2i+1) rotate
// together by frequency i. transformers permutes them to halves before its rotate_half; our
// import picks the rows into halves order (hf_mla.cpp: ours rotate (i, i + dr/2)). llama.cpp's
// deepseek2 uses NORM rope (LLAMA_ROPE_TYPE_NORM: adjacent pairs (2i, 2i+1) by frequency i) on
// the file's rows as they are, and its converter copies DeepSeek's rows unpermuted. So the file
// holds the rope rows interleaved, as DeepSeek's own layout: hf::mla_hf_tensors assembles exactly
// that (rope_interleave true), whatever layout the model was imported from.
#include <cmath>

#include "io/gguf_writer.h"
#include "io/hf_mla.h"
#include "moe/error.h"
#include "moe/rope_scaling.h"

namespace moe::io::gguf_out {

namespace {

// The leading dense layers (ExportModel has checked that none follows an MoE layer).
int64_t leading_dense(const ModelConfig& mc) {
  int64_t k = 0;
  while (k < mc.layers && !mc.is_moe_layer(k)) ++k;
  return k;
}

// llama.cpp's deepseek2 runs YaRN with the attention scale DeepSeek's modelling code uses only
// when mscale equals mscale_all_dim (it assumes so: llama-context's yarn_attn_factor for
// deepseek2): the rotation then keeps its length and the scores are multiplied by
// (0.1 mscale_all_dim ln(factor) + 1)^2, its yarn_log_multiplier key (written as
// 0.1 mscale_all_dim, as its converter writes it). Betas and the truncated range it takes as
// YaRN's defaults.
void check_deepseek2_yarn(const ModelConfig& mc) {
  if (mc.rope_type != RopeType::yarn) return;
  const ops::YarnSettings& y = mc.yarn;
  const char* differs =
      y.beta_fast != 32 || y.beta_slow != 1 ? "beta_fast / beta_slow"
      : !y.truncate                         ? "truncate false"
      : y.attention_factor > 0              ? "attention_factor"
      : !(y.mscale_all_dim > 0)
          ? "no mscale_all_dim (llama.cpp would scale the rotation and the scores)"
      : y.mscale != y.mscale_all_dim ? "mscale other than mscale_all_dim"
                                     : nullptr;
  if (differs)
    throw Error(str("GGUF export: this model's YaRN sets ", differs,
                    ", which llama.cpp's deepseek2 does not read (it takes YaRN's defaults and "
                    "mscale = mscale_all_dim)"));
}

}  // namespace

void check_deepseek2(const ModelConfig& mc) {
  if (!mc.mla())
    throw Error(
        "GGUF export: llama.cpp's deepseek2 has latent attention; this deepseek_v3 model "
        "has none (kv_lora_rank 0)");
  if (mc.shared_expert_ff == 0)
    throw Error(
        "GGUF export: llama.cpp's deepseek2 always runs a shared expert; this model has none "
        "(shared_expert_ff 0)");
  if (mc.shared_expert_ff % mc.d_ff != 0)
    throw Error(str("GGUF export: llama.cpp's deepseek2 sizes the shared expert in whole experts (",
                    mc.d_ff, " wide each); this model's is ", mc.shared_expert_ff, " wide"));
  if (mc.qk_rope_dim % 2 != 0 || mc.qk_nope_dim < 1)
    throw Error(str("GGUF export: llama.cpp's deepseek2 needs an even rope width and a nope part; ",
                    "this model's heads are ", mc.qk_nope_dim, " + ", mc.qk_rope_dim, " wide"));
  const bool softmax = mc.router_scoring == nn::RouterScoring::softmax;
  if (softmax && mc.router_selection_bias())
    throw Error(
        "GGUF export: llama.cpp's deepseek2 adds exp_probs_b to sigmoid scores only; this "
        "model's softmax router carries a selection bias (balance_bias_rate)");
  check_deepseek2_yarn(mc);
}

void deepseek2_attention(ExportModel& m, int64_t i, const MatrixType& matrix_type,
                         std::vector<Planned>& plan) {
  const ModelConfig& mc = m.config();
  const int64_t H = mc.heads, c = mc.kv_lora_rank, dn = mc.qk_nope_dim, dv = mc.v_head_dim;
  const std::string ours = str("blocks.", i, "."), blk = str("blk.", i, ".");
  auto param = [&](const std::string& name, const Shape& shape) -> const NamedTensor& {
    return m.param(name, shape);
  };
  // HF's tensors in DeepSeek's layout (the rope rows interleaved), each read when written.
  const std::vector<NamedTensor> hf = hf::mla_hf_tensors(mc, ours, "", param);
  auto values_of = [](const NamedTensor& nt) {
    return [nt](int64_t) { return nt.whole().to_vector(); };
  };
  for (const NamedTensor& nt : hf) {
    const Shape& s = nt.shape();
    auto matrix = [&](const std::string& gguf) {
      const std::string name = blk + gguf;
      plan.push_back({name, {s[1], s[0]}, matrix_type(name, s[1]), 1, values_of(nt)});
    };
    auto vector = [&](const std::string& gguf) {
      plan.push_back({blk + gguf, {s[0]}, GgufType::f32, 1, values_of(nt)});
    };
    if (nt.name == "q_a_proj.weight") matrix("attn_q_a.weight");
    if (nt.name == "q_a_layernorm.weight") vector("attn_q_a_norm.weight");
    if (nt.name == "q_b_proj.weight") matrix("attn_q_b.weight");
    if (nt.name == "q_proj.weight") matrix("attn_q.weight");
    if (nt.name == "kv_a_proj_with_mqa.weight") matrix("attn_kv_a_mqa.weight");
    if (nt.name == "kv_a_layernorm.weight") vector("attn_kv_a_norm.weight");
    if (nt.name == "o_proj.weight") matrix("attn_output.weight");
    if (nt.name != "kv_b_proj.weight") continue;
    // kv_b_proj split as llama.cpp's converter splits it for its absorbed attention: k_b per
    // head transposed ([H, c, dn]: {dn, c, H}), v_b per head as it is ([H, dv, c]: {c, dv, H}).
    const NamedTensor& k_b = m.param(ours + "attn.k_b.weight", {H * dn, c});
    const NamedTensor& v_b = m.param(ours + "attn.v_b.weight", {H * dv, c});
    const std::string kb = blk + "attn_k_b.weight", vb = blk + "attn_v_b.weight";
    plan.push_back({kb, {dn, c, H}, matrix_type(kb, dn), 1, [&k_b, H, c, dn](int64_t) {
                      const std::vector<float> w = k_b.whole().to_vector();  // [H, dn, c]
                      std::vector<float> t(w.size());
                      for (int64_t h = 0; h < H; ++h)
                        for (int64_t j = 0; j < dn; ++j)
                          for (int64_t x = 0; x < c; ++x)
                            t[size_t((h * c + x) * dn + j)] = w[size_t((h * dn + j) * c + x)];
                      return t;
                    }});
    plan.push_back({vb, {c, dv, H}, matrix_type(vb, c), 1, [&v_b](int64_t) {
                      return v_b.whole().to_vector();
                    }});
  }
}

void write_deepseek2_keys(Header& h, const ModelConfig& mc) {
  const std::string a = "deepseek2.";
  const int64_t c = mc.kv_lora_rank, dr = mc.qk_rope_dim;
  // As llama.cpp's converter writes them: the latent ranks (q_lora_rank 0 for a plain q
  // projection: llama.cpp then loads attn_q, whatever the layer count; its converter leaves the
  // key out and llama.cpp guesses V2-Lite from 26/27 layers), the absorbed attention's widths
  // (key c + dr, value c: one latent head) and the per-head ones (*_mla).
  h.kv_u32(a + "attention.q_lora_rank", static_cast<uint32_t>(mc.q_lora_rank));
  h.kv_u32(a + "attention.kv_lora_rank", static_cast<uint32_t>(c));
  h.kv_u32(a + "attention.key_length", static_cast<uint32_t>(c + dr));
  h.kv_u32(a + "attention.value_length", static_cast<uint32_t>(c));
  h.kv_u32(a + "attention.key_length_mla", static_cast<uint32_t>(mc.qk_nope_dim + dr));
  h.kv_u32(a + "attention.value_length_mla", static_cast<uint32_t>(mc.v_head_dim));
  // Routing: V3's sigmoid scores with the selection bias (exp_probs_b), V2's softmax; groups that
  // all take part are no limit and go out as one (llama.cpp refuses used == count).
  const bool grouped = mc.router_groups > 1 && mc.router_group_topk < mc.router_groups;
  const bool sigmoid = mc.router_scoring == nn::RouterScoring::sigmoid;
  h.kv_u32(a + "leading_dense_block_count", static_cast<uint32_t>(leading_dense(mc)));
  h.kv_u32(a + "expert_shared_count", static_cast<uint32_t>(mc.shared_expert_ff / mc.d_ff));
  h.kv_f32(a + "expert_weights_scale", static_cast<float>(mc.routed_scale));
  h.kv_bool(a + "expert_weights_norm", mc.normalize_topk);
  h.kv_u32(a + "expert_gating_func", sigmoid ? 2 : 1);  // llama.cpp's SIGMOID / SOFTMAX
  h.kv_u32(a + "expert_group_count", static_cast<uint32_t>(grouped ? mc.router_groups : 1));
  h.kv_u32(a + "expert_group_used_count",
           static_cast<uint32_t>(grouped ? mc.router_group_topk : 1));
  if (mc.rope_type != RopeType::yarn) return;
  // check_deepseek2_yarn: mscale == mscale_all_dim > 0, betas 32 / 1 (written as the converter
  // writes a config's beta_fast / beta_slow, DeepSeek-V3's among them).
  h.kv_f32(a + "rope.scaling.yarn_log_multiplier",
           static_cast<float>(0.1 * mc.yarn.mscale_all_dim));
  h.kv_f32(a + "rope.scaling.yarn_beta_fast", static_cast<float>(mc.yarn.beta_fast));
  h.kv_f32(a + "rope.scaling.yarn_beta_slow", static_cast<float>(mc.yarn.beta_slow));
}

}  // namespace moe::io::gguf_out
