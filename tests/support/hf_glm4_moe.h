// A tiny GLM-4-MoE checkpoint (transformers' Glm4MoeForCausalLM: GLM-4.5, GLM-4.5-Air, GLM-4.6)
// for the import/export tests, and an independent double-precision reference of its forward pass
// written from transformers' modeling_glm4_moe.py, never from our layers:
//   attention:  RMSNorm -> q/k/v (+ biases when attention_bias) -> per-head RMSNorm of q and k
//               (use_qk_norm) -> RoPE on the first int(head_dim * partial_rotary_factor)
//               features of each head (rotate_half within them; the rest untouched) -> causal
//               GQA softmax attention (scale head_dim^-0.5) -> o (no bias).
//   MLP:        the first first_k_dense_replace layers a SwiGLU of intermediate_size; the others
//               Glm4MoeMoE: sigmoid(x W_gate^T) scores; the choice by scores +
//               e_score_correction_bias, limited to the topk_group groups (of n_group) whose two
//               best biased scores sum highest, the other experts' biased scores set to 0; the
//               weights the unbiased scores of the chosen, divided by their sum (+1e-20) when
//               norm_topk_prob, times routed_scaling_factor; plus the shared experts (a SwiGLU of
//               n_shared_experts * moe_intermediate_size), added without a gate.
// Shape letters: V vocabulary, D hidden, H heads, KV kv heads, hd head dim, rd rotated dims,
// F expert hidden, Fd dense hidden, E experts, G groups, k top-k, L layers, B batch, T sequence.
#pragma once
#include <string>
#include <vector>

#include "support/hf_families.h"

namespace moe::test::hf {

struct TinyGlm {
  int64_t V = 256, D = 32, H = 4, KV = 2, hd = 16, F = 24, Fd = 56, L = 3, E = 8, k = 2;
  int64_t dense = 1;     // first_k_dense_replace
  int64_t shared = 1;    // n_shared_experts
  int64_t groups = 4;    // n_group (DeepSeek-V3: 8 groups, 4 chosen)
  int64_t group_k = 2;   // topk_group
  double partial = 0.5;  // partial_rotary_factor
  double scale = 2.5;    // routed_scaling_factor
  bool bias = true, qk_norm = true, norm_topk = true;
  double theta = 10000, eps = 1e-5;
  int64_t max_pos = 64;
  int64_t rd() const { return int64_t(double(hd) * partial); }
  Tiny base() const {  // the shape fields the shared helpers read
    Tiny t;
    t.family = "glm4_moe";
    t.V = V, t.D = D, t.H = H, t.KV = KV, t.F = F, t.L = L, t.E = E, t.k = k;
    t.head_dim = hd, t.theta = theta, t.eps = eps, t.max_pos = max_pos;
    return t;
  }
};

// config.json as Glm4MoeConfig writes it.
inline json glm_config(const TinyGlm& t) {
  return json{{"architectures", {"Glm4MoeForCausalLM"}},
              {"model_type", "glm4_moe"},
              {"vocab_size", t.V},
              {"hidden_size", t.D},
              {"intermediate_size", t.Fd},
              {"moe_intermediate_size", t.F},
              {"num_hidden_layers", t.L},
              {"num_attention_heads", t.H},
              {"num_key_value_heads", t.KV},
              {"head_dim", t.hd},
              {"partial_rotary_factor", t.partial},
              {"hidden_act", "silu"},
              {"max_position_embeddings", t.max_pos},
              {"initializer_range", 0.02},
              {"rms_norm_eps", t.eps},
              {"use_cache", true},
              {"tie_word_embeddings", false},
              {"rope_theta", t.theta},
              {"rope_scaling", nullptr},
              {"attention_bias", t.bias},
              {"attention_dropout", 0.0},
              {"num_experts_per_tok", t.k},
              {"n_shared_experts", t.shared},
              {"n_routed_experts", t.E},
              {"routed_scaling_factor", t.scale},
              {"n_group", t.groups},
              {"topk_group", t.group_k},
              {"first_k_dense_replace", t.dense},
              {"norm_topk_prob", t.norm_topk},
              {"use_qk_norm", t.qk_norm},
              {"torch_dtype", "float32"}};
}

// Every tensor Glm4MoeForCausalLM creates, with random values at scales that keep activations
// O(1); the correction bias (f32, as transformers keeps it) large enough to change choices.
inline std::map<std::string, Tensor> glm_weights(const TinyGlm& t, uint64_t seed) {
  std::map<std::string, Tensor> w;
  uint64_t s = seed * 1000;
  const float in_scale = 1.0f / std::sqrt(float(t.D));
  auto near_one = [&](int64_t n) {
    Tensor x = random_tensor({n}, ++s, 0.2f);
    float* p = x.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] += 1.0f;
    return x;
  };
  auto mlp = [&](const std::string& p, int64_t F) {
    w[p + "gate_proj.weight"] = random_tensor({F, t.D}, ++s, in_scale);
    w[p + "up_proj.weight"] = random_tensor({F, t.D}, ++s, in_scale);
    w[p + "down_proj.weight"] = random_tensor({t.D, F}, ++s, 1.0f / std::sqrt(float(F)));
  };
  w["model.embed_tokens.weight"] = random_tensor({t.V, t.D}, ++s);
  for (int64_t i = 0; i < t.L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    w[p + "input_layernorm.weight"] = near_one(t.D);
    w[p + "post_attention_layernorm.weight"] = near_one(t.D);
    w[p + "self_attn.q_proj.weight"] = random_tensor({t.H * t.hd, t.D}, ++s, in_scale);
    w[p + "self_attn.k_proj.weight"] = random_tensor({t.KV * t.hd, t.D}, ++s, in_scale);
    w[p + "self_attn.v_proj.weight"] = random_tensor({t.KV * t.hd, t.D}, ++s, in_scale);
    w[p + "self_attn.o_proj.weight"] =
        random_tensor({t.D, t.H * t.hd}, ++s, 1.0f / std::sqrt(float(t.H * t.hd)));
    if (t.bias) {
      w[p + "self_attn.q_proj.bias"] = random_tensor({t.H * t.hd}, ++s, 0.5f);
      w[p + "self_attn.k_proj.bias"] = random_tensor({t.KV * t.hd}, ++s, 0.5f);
      w[p + "self_attn.v_proj.bias"] = random_tensor({t.KV * t.hd}, ++s, 0.5f);
    }
    if (t.qk_norm) {
      w[p + "self_attn.q_norm.weight"] = near_one(t.hd);
      w[p + "self_attn.k_norm.weight"] = near_one(t.hd);
    }
    if (i < t.dense) {
      mlp(p + "mlp.", t.Fd);
      continue;
    }
    w[p + "mlp.gate.weight"] = random_tensor({t.E, t.D}, ++s, 3 * in_scale);
    w[p + "mlp.gate.e_score_correction_bias"] = random_tensor({t.E}, ++s, 0.3f);
    for (int64_t e = 0; e < t.E; ++e) mlp(p + "mlp.experts." + std::to_string(e) + ".", t.F);
    if (t.shared > 0) mlp(p + "mlp.shared_experts.", t.shared * t.F);
  }
  w["model.norm.weight"] = near_one(t.D);
  w["lm_head.weight"] = random_tensor({t.V, t.D}, ++s, in_scale);
  return w;
}

// Glm4MoeTopkRouter of one token: the chosen experts and their weights, from the router's
// unbiased sigmoid scores and the correction bias.
inline std::vector<std::pair<int64_t, double>> glm_route(const TinyGlm& t, const Vec& scores,
                                                         const Vec& bias) {
  const int64_t size = t.E / t.groups;
  Vec choice(size_t(t.E));
  for (int64_t e = 0; e < t.E; ++e) choice[size_t(e)] = scores[size_t(e)] + bias[size_t(e)];
  // Each group's score: its two largest biased scores, summed.
  std::vector<std::pair<double, int64_t>> group_scores;
  for (int64_t g = 0; g < t.groups; ++g) {
    Vec members(choice.begin() + g * size, choice.begin() + (g + 1) * size);
    std::sort(members.begin(), members.end(), std::greater<double>());
    group_scores.push_back({members[0] + members[1], g});
  }
  std::stable_sort(group_scores.begin(), group_scores.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<bool> kept(size_t(t.groups), false);
  for (int64_t j = 0; j < t.group_k; ++j) kept[size_t(group_scores[size_t(j)].second)] = true;
  for (int64_t e = 0; e < t.E; ++e)
    if (!kept[size_t(e / size)]) choice[size_t(e)] = 0.0;  // masked_fill(~mask, 0.0)
  std::vector<int64_t> order(size_t(t.E));
  for (int64_t e = 0; e < t.E; ++e) order[size_t(e)] = e;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return choice[size_t(a)] > choice[size_t(b)]; });
  double sum = 0;
  for (int64_t j = 0; j < t.k; ++j) sum += scores[size_t(order[size_t(j)])];
  std::vector<std::pair<int64_t, double>> out;
  for (int64_t j = 0; j < t.k; ++j) {
    const int64_t e = order[size_t(j)];
    const double weight = t.norm_topk ? scores[size_t(e)] / (sum + 1e-20) : scores[size_t(e)];
    out.push_back({e, weight * t.scale});
  }
  return out;
}

// The MLP of layer `p` ("model.layers.3.") for one normalised token x.
inline Vec glm_mlp(const TinyGlm& t, const std::map<std::string, Tensor>& w, const std::string& p,
                   const Vec& x, int64_t layer) {
  auto mlp = [&](const std::string& q, const Vec& in, int64_t F) {
    return swiglu(values(w, q + "gate_proj.weight"), values(w, q + "up_proj.weight"),
                  values(w, q + "down_proj.weight"), in, F, t.D);
  };
  if (layer < t.dense) return mlp(p + "mlp.", x, t.Fd);
  Vec scores = linear(values(w, p + "mlp.gate.weight"), x, t.E);
  for (double& s : scores) s = 1.0 / (1.0 + std::exp(-s));
  Vec out(size_t(t.D), 0.0);
  for (const auto& [e, weight] :
       glm_route(t, scores, values(w, p + "mlp.gate.e_score_correction_bias"))) {
    const Vec y = mlp(p + "mlp.experts." + std::to_string(e) + ".", x, t.F);
    for (int64_t i = 0; i < t.D; ++i) out[size_t(i)] += weight * y[size_t(i)];
  }
  if (t.shared > 0) {
    const Vec y = mlp(p + "mlp.shared_experts.", x, t.shared * t.F);
    for (int64_t i = 0; i < t.D; ++i) out[size_t(i)] += y[size_t(i)];
  }
  return out;
}

// Glm4MoeAttention of layer `p` over the whole batch, added into h.
inline void glm_attention(const TinyGlm& t, const std::map<std::string, Tensor>& w,
                          const std::string& p, std::vector<Vec>& h, int64_t B, int64_t T) {
  const int64_t hd = t.hd, QW = t.H * hd, KW = t.KV * hd, n_rep = t.H / t.KV;
  const Vec ln1 = values(w, p + "input_layernorm.weight");
  const Vec bq = optional(w, p + "self_attn.q_proj.bias"),
            bk = optional(w, p + "self_attn.k_proj.bias"),
            bv = optional(w, p + "self_attn.v_proj.bias");
  const Vec qn = optional(w, p + "self_attn.q_norm.weight"),
            kn = optional(w, p + "self_attn.k_norm.weight");
  auto with = [](const Vec& b) { return b.empty() ? nullptr : &b; };
  std::vector<Vec> q(size_t(B * T)), k(size_t(B * T)), v(size_t(B * T));
  for (int64_t r = 0; r < B * T; ++r) {
    const Vec x = rms_norm(h[size_t(r)], ln1, t.eps);
    q[size_t(r)] = linear(values(w, p + "self_attn.q_proj.weight"), x, QW, with(bq));
    k[size_t(r)] = linear(values(w, p + "self_attn.k_proj.weight"), x, KW, with(bk));
    v[size_t(r)] = linear(values(w, p + "self_attn.v_proj.weight"), x, KW, with(bv));
    for (int64_t head = 0; head < t.H; ++head) {
      if (!qn.empty()) rms_norm_into(&q[size_t(r)][size_t(head * hd)], qn.data(), hd, t.eps);
      hf_rotary(&q[size_t(r)][size_t(head * hd)], t.rd(), r % T, t.theta);
    }
    for (int64_t head = 0; head < t.KV; ++head) {
      if (!kn.empty()) rms_norm_into(&k[size_t(r)][size_t(head * hd)], kn.data(), hd, t.eps);
      hf_rotary(&k[size_t(r)][size_t(head * hd)], t.rd(), r % T, t.theta);
    }
  }
  const Vec Wo = values(w, p + "self_attn.o_proj.weight");
  for (int64_t r = 0; r < B * T; ++r) {
    const int64_t first = r - r % T;  // the window's first row: causal within it
    Vec ctx(size_t(QW), 0.0);
    for (int64_t head = 0; head < t.H; ++head) {
      const int64_t kv = head / n_rep;
      Vec scores;
      for (int64_t u = first; u <= r; ++u) {
        double dot = 0;
        for (int64_t j = 0; j < hd; ++j)
          dot += q[size_t(r)][size_t(head * hd + j)] * k[size_t(u)][size_t(kv * hd + j)];
        scores.push_back(dot / std::sqrt(double(hd)));
      }
      const double top = *std::max_element(scores.begin(), scores.end());
      double sum = 0;
      for (double& sc : scores) sum += (sc = std::exp(sc - top));
      for (int64_t u = first; u <= r; ++u)
        for (int64_t j = 0; j < hd; ++j)
          ctx[size_t(head * hd + j)] +=
              scores[size_t(u - first)] / sum * v[size_t(u)][size_t(kv * hd + j)];
    }
    const Vec out = linear(Wo, ctx, t.D);
    for (int64_t i = 0; i < t.D; ++i) h[size_t(r)][size_t(i)] += out[size_t(i)];
  }
}

// Logits [B*T, V] of Glm4MoeForCausalLM for ids [B, T].
inline Vec glm_reference_logits(const TinyGlm& t, const std::map<std::string, Tensor>& w,
                                const std::vector<int32_t>& ids, int64_t B, int64_t T) {
  const Vec embed = values(w, "model.embed_tokens.weight");
  std::vector<Vec> h(size_t(B * T));
  for (int64_t r = 0; r < B * T; ++r)
    h[size_t(r)] =
        Vec(embed.begin() + ids[size_t(r)] * t.D, embed.begin() + (ids[size_t(r)] + 1) * t.D);
  for (int64_t l = 0; l < t.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    glm_attention(t, w, p, h, B, T);
    const Vec ln2 = values(w, p + "post_attention_layernorm.weight");
    for (int64_t r = 0; r < B * T; ++r) {
      const Vec y = glm_mlp(t, w, p, rms_norm(h[size_t(r)], ln2, t.eps), l);
      for (int64_t i = 0; i < t.D; ++i) h[size_t(r)][size_t(i)] += y[size_t(i)];
    }
  }
  const Vec final_norm = values(w, "model.norm.weight"), head = values(w, "lm_head.weight");
  Vec out;
  for (int64_t r = 0; r < B * T; ++r) {
    const Vec logits = linear(head, rms_norm(h[size_t(r)], final_norm, t.eps), t.V);
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

}  // namespace moe::test::hf
