// A tiny DeepSeek-V3 checkpoint as transformers' DeepseekV3ForCausalLM saves it (config.json with
// DeepseekV3Config's keys; every tensor its classes create, plus a multi-token-prediction layer
// as the released checkpoints hold one), and the double-precision reference of its logits: the
// latent attention of hf_deepseek_v3.h and the MoE layers GLM-4-MoE shares with DeepSeek-V3
// (hf_glm4_moe.h's glm_mlp: sigmoid router with correction bias, groups, scale, shared experts,
// first_k_dense_replace dense layers).
#pragma once
#include <string>
#include <vector>

#include "support/hf_deepseek_v3.h"
#include "support/hf_glm4_moe.h"

namespace moe::test::hf {

struct TinyDeepseek {
  TinyGlm moe;          // the MoE shape (its attention fields unused)
  dsv3::MlaShape attn;  // D and H must equal moe's
  int64_t nextn = 1;    // num_nextn_predict_layers written after the last layer
  bool interleave = true;
  // DeepSeek-V2 (model_type deepseek_v2): softmax router without a correction bias, the top-k
  // probabilities times routed_scaling_factor (transformers' DeepseekV2TopkRouter, "greedy").
  bool v2 = false;
  TinyDeepseek() {
    moe.D = 12, moe.H = 3, moe.V = 64, moe.F = 10, moe.Fd = 20, moe.L = 3, moe.E = 8, moe.k = 3;
    moe.dense = 1, moe.shared = 1, moe.groups = 4, moe.group_k = 2, moe.scale = 2.5;
    moe.bias = false, moe.qk_norm = false, moe.theta = 50, moe.eps = 1e-6;
    attn.D = 12, attn.H = 3, attn.theta = 50, attn.eps = 1e-6;
  }
};

// rope_parameters as DeepseekV3Config writes them: the default, or YaRN's (t.attn.yarn on).
inline json deepseek_rope(const TinyDeepseek& t) {
  const dsv3::Yarn& y = t.attn.yarn;
  if (!y.on()) return json{{"rope_theta", t.moe.theta}, {"rope_type", "default"}};
  return json{
      {"rope_theta", t.moe.theta}, {"rope_type", "yarn"},
      {"factor", y.factor},        {"original_max_position_embeddings", int64_t(y.original)},
      {"beta_fast", y.beta_fast},  {"beta_slow", y.beta_slow},
      {"mscale", y.mscale},        {"mscale_all_dim", y.mscale_all_dim}};
}

// config.json as DeepseekV3Config writes it (transformers 5.25).
inline json deepseek_config(const TinyDeepseek& t) {
  const TinyGlm& m = t.moe;
  return json{{"architectures", {"DeepseekV3ForCausalLM"}},
              {"model_type", "deepseek_v3"},
              {"vocab_size", m.V},
              {"hidden_size", m.D},
              {"intermediate_size", m.Fd},
              {"moe_intermediate_size", m.F},
              {"num_hidden_layers", m.L},
              {"num_attention_heads", m.H},
              {"num_key_value_heads", 128},  // the class default: MLA does not use it
              {"head_dim", t.attn.dr},       // transformers writes qk_rope_head_dim here
              {"q_lora_rank", t.attn.r > 0 ? json(t.attn.r) : json(nullptr)},
              {"kv_lora_rank", t.attn.c},
              {"qk_nope_head_dim", t.attn.dn},
              {"qk_rope_head_dim", t.attn.dr},
              {"qk_head_dim", t.attn.dn + t.attn.dr},
              {"v_head_dim", t.attn.dv},
              {"rope_interleave", t.interleave},
              {"hidden_act", "silu"},
              {"max_position_embeddings", m.max_pos},
              {"rms_norm_eps", m.eps},
              {"rope_parameters", deepseek_rope(t)},
              {"attention_bias", false},
              {"n_shared_experts", m.shared},
              {"n_routed_experts", m.E},
              {"num_experts_per_tok", m.k},
              {"routed_scaling_factor", m.scale},
              {"n_group", m.groups},
              {"topk_group", m.group_k},
              {"first_k_dense_replace", m.dense},
              {"norm_topk_prob", m.norm_topk},
              {"num_nextn_predict_layers", t.nextn},
              {"tie_word_embeddings", false},
              {"dtype", "float32"}};
}

// config.json as DeepseekV2Config writes it: V3's keys less the sigmoid router's, with
// topk_method greedy (no group limit) and no renormalisation.
inline json deepseek_v2_config(const TinyDeepseek& t) {
  json c = deepseek_config(t);
  c["architectures"] = {"DeepseekV2ForCausalLM"};
  c["model_type"] = "deepseek_v2";
  for (const char* key :
       {"n_group", "topk_group", "rope_interleave", "num_nextn_predict_layers", "qk_head_dim"})
    c.erase(key);
  c["topk_method"] = "greedy";
  c["norm_topk_prob"] = false;
  return c;
}

// Every tensor: GLM's MoE layers and outer tensors, the latent attention of each layer, and
// (nextn > 0) a prediction layer's extra tensors after the last.
inline std::map<std::string, Tensor> deepseek_weights(const TinyDeepseek& t, uint64_t seed) {
  std::map<std::string, Tensor> w;
  for (auto& [name, value] : glm_weights(t.moe, seed))
    if (name.find(".self_attn.") == std::string::npos &&
        !(t.v2 && name.ends_with("e_score_correction_bias")))
      w[name] = value;
  for (int64_t l = 0; l < t.moe.L + t.nextn; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    for (auto& [name, value] : dsv3::mla_weights(t.attn, seed * 10 + uint64_t(l)))
      w[p + name] = value;
  }
  for (int64_t l = t.moe.L; l < t.moe.L + t.nextn; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w[p + "eh_proj.weight"] = random_tensor({t.moe.D, 2 * t.moe.D}, seed + 99);
    w[p + "enorm.weight"] = random_tensor({t.moe.D}, seed + 98);
  }
  return w;
}

// DeepseekV2Moe of layer `p` for one normalised token x (the dense MLP before the MoE layers).
inline Vec deepseek_v2_mlp(const TinyGlm& t, const std::map<std::string, Tensor>& w,
                           const std::string& p, const Vec& x, int64_t layer) {
  auto mlp = [&](const std::string& q, int64_t F) {
    return swiglu(values(w, q + "gate_proj.weight"), values(w, q + "up_proj.weight"),
                  values(w, q + "down_proj.weight"), x, F, t.D);
  };
  if (layer < t.dense) return mlp(p + "mlp.", t.Fd);
  Vec probs = linear(values(w, p + "mlp.gate.weight"), x, t.E);
  double top = probs[0], sum = 0;
  for (double v : probs) top = std::max(top, v);
  for (double& v : probs) sum += (v = std::exp(v - top));
  for (double& v : probs) v /= sum;
  std::vector<int64_t> order(size_t(t.E));
  for (int64_t e = 0; e < t.E; ++e) order[size_t(e)] = e;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return probs[size_t(a)] > probs[size_t(b)]; });
  Vec out(size_t(t.D), 0.0);
  for (int64_t j = 0; j < t.k; ++j) {
    const int64_t e = order[size_t(j)];
    const Vec y = mlp(p + "mlp.experts." + std::to_string(e) + ".", t.F);
    for (int64_t i = 0; i < t.D; ++i) out[size_t(i)] += probs[size_t(e)] * t.scale * y[size_t(i)];
  }
  const Vec y = mlp(p + "mlp.shared_experts.", t.shared * t.F);
  for (int64_t i = 0; i < t.D; ++i) out[size_t(i)] += y[size_t(i)];
  return out;
}

// Logits [B*T, V] of DeepseekV3ForCausalLM (DeepseekV2ForCausalLM when t.v2) for ids [B, T].
inline Vec deepseek_reference_logits(const TinyDeepseek& t, const std::map<std::string, Tensor>& w,
                                     const std::vector<int32_t>& ids, int64_t B, int64_t T) {
  const TinyGlm& m = t.moe;
  const Vec embed = values(w, "model.embed_tokens.weight");
  std::vector<Vec> h(size_t(B * T));
  for (int64_t r = 0; r < B * T; ++r)
    h[size_t(r)] =
        Vec(embed.begin() + ids[size_t(r)] * m.D, embed.begin() + (ids[size_t(r)] + 1) * m.D);
  for (int64_t l = 0; l < m.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    dsv3::Weights attn;
    for (const auto& [name, value] : w)
      if (name.rfind(p + "self_attn.", 0) == 0) attn[name.substr(p.size() + 10)] = value;
    const Vec ln1 = values(w, p + "input_layernorm.weight");
    Vec x;
    for (int64_t r = 0; r < B * T; ++r) {
      const Vec n = rms_norm(h[size_t(r)], ln1, m.eps);
      x.insert(x.end(), n.begin(), n.end());
    }
    const Vec a = dsv3::mla_reference(t.attn, attn, x, B, T);
    const Vec ln2 = values(w, p + "post_attention_layernorm.weight");
    for (int64_t r = 0; r < B * T; ++r) {
      for (int64_t i = 0; i < m.D; ++i) h[size_t(r)][size_t(i)] += a[size_t(r * m.D + i)];
      const Vec n = rms_norm(h[size_t(r)], ln2, m.eps);
      const Vec y = t.v2 ? deepseek_v2_mlp(m, w, p, n, l) : glm_mlp(m, w, p, n, l);
      for (int64_t i = 0; i < m.D; ++i) h[size_t(r)][size_t(i)] += y[size_t(i)];
    }
  }
  const Vec final_norm = values(w, "model.norm.weight"), head = values(w, "lm_head.weight");
  Vec out;
  for (int64_t r = 0; r < B * T; ++r) {
    const Vec logits = linear(head, rms_norm(h[size_t(r)], final_norm, m.eps), m.V);
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

}  // namespace moe::test::hf
