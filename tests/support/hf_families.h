// Tiny Hugging Face MoE checkpoints for the import/export tests, and an independent
// double-precision reference of their forward passes written from the published modelling math
// (transformers' modeling_mixtral / qwen2_moe / qwen3_moe / olmoe), never from our layers.
//   writers:    config.json with the keys each family's config class writes, and every tensor its
//               classes create (Qwen2-MoE's q/k/v biases and gated shared expert, even when the
//               shared expert is 0 wide; Qwen3-MoE's per-head q_norm/k_norm and head_dim; OLMoE's
//               full-width q_norm/k_norm), one model.safetensors or shards named by an index.
//   reference:  embedding -> per layer [RMSNorm -> q/k/v (+ biases) -> qk-norm -> rotate_half RoPE
//               -> causal GQA softmax attention -> o] + [RMSNorm -> softmax router -> top-k
//               (renormalised or not) -> SwiGLU experts (+ sigmoid-gated shared expert)] ->
//               RMSNorm -> LM head.
// Shape letters: V vocabulary, D hidden, H heads, KV kv heads, hd head dim, F expert hidden,
// Fs shared expert hidden, E experts, k top-k, L layers, B batch, T sequence.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "moe/io/hf_checkpoint.h"
#include "moe/io/safetensors.h"
#include "support/gradcheck.h"
#include "support/run.h"
#include "support/yarn_reference.h"

namespace moe::test {

// io::import_hf with every value read (hold_all): the tests compare tensors in memory, and
// refusals of values (NaN, ...) happen here rather than when the checkpoint is written.
inline io::Checkpoint import_hf_held(const std::string& dir,
                                     const io::HfImportOptions& options = {},
                                     io::HfImportReport* report = nullptr) {
  io::Checkpoint c = io::import_hf(dir, options, report);
  io::hold_all(c);
  return c;
}
inline io::Checkpoint import_hf_held(const std::string& dir, bool allow_unmapped,
                                     io::HfImportReport* report) {
  io::HfImportOptions options;
  options.allow_unmapped = allow_unmapped;
  return import_hf_held(dir, options, report);
}

}  // namespace moe::test

namespace moe::test::hf {

using nlohmann::json;
using Vec = std::vector<double>;

// A tiny model of one family (config.json model_type).
struct Tiny {
  std::string family = "mixtral";  // mixtral | qwen2_moe | qwen3_moe | olmoe
  int64_t V = 256, D = 32, H = 4, KV = 2, F = 48, L = 2, E = 4, k = 2, max_pos = 64;
  int64_t head_dim = 0;   // 0: D / H; Qwen3-MoE writes it (and may differ from D / H)
  int64_t shared_F = 0;   // Qwen2-MoE shared_expert_intermediate_size
  bool norm_topk = true;  // norm_topk_prob (Mixtral always renormalises)
  double theta = 10000, eps = 1e-5;
  // Sliding window (transformers 5's mask: query s sees keys s - window < u <= s; 0 = none) on
  // window_layers (empty: every layer); tied: the LM head is model.embed_tokens.weight.
  int64_t window = 0;
  std::vector<int64_t> window_layers;
  bool tied = false;
  YarnRef yarn;  // YaRN RoPE when yarn.on() (rope_scaling type "yarn"; no softmax factor here)
  int64_t hd() const { return head_dim ? head_dim : D / H; }
  int64_t window_of(int64_t layer) const {
    const bool on = window_layers.empty() ||
                    std::find(window_layers.begin(), window_layers.end(), layer) !=
                        window_layers.end();
    return on ? window : 0;
  }
};

inline Tiny tiny_of(const std::string& family) {
  Tiny t;
  t.family = family;
  if (family == "qwen2_moe") {
    t.shared_F = 40;
    t.norm_topk = false;  // Qwen1.5-MoE-A2.7B
  } else if (family == "qwen3_moe") {
    t.head_dim = 16;  // Qwen3-30B-A3B: 32 heads of 128 on a hidden size of 2048
  } else if (family == "olmoe") {
    t.norm_topk = false;
  }
  return t;
}

// rope_scaling as transformers writes YaRN's (gpt-oss's keys: truncate false when set), or null.
inline json yarn_config(const YarnRef& y) {
  if (!y.on()) return nullptr;
  json r{{"rope_type", "yarn"},
         {"factor", y.factor},
         {"original_max_position_embeddings", int64_t(y.original)},
         {"beta_fast", y.beta_fast},
         {"beta_slow", y.beta_slow}};
  if (!y.truncate) r["truncate"] = false;
  return r;
}

// HF Mixtral config.json for `t`.
inline json mixtral_config(const Tiny& t) {
  return json{{"architectures", {"MixtralForCausalLM"}},
              {"model_type", "mixtral"},
              {"vocab_size", t.V},
              {"hidden_size", t.D},
              {"intermediate_size", t.F},
              {"num_hidden_layers", t.L},
              {"num_attention_heads", t.H},
              {"num_key_value_heads", t.KV},
              {"num_local_experts", t.E},
              {"num_experts_per_tok", t.k},
              {"rope_theta", t.theta},
              {"rms_norm_eps", t.eps},
              {"max_position_embeddings", t.max_pos},
              {"hidden_act", "silu"},
              {"sliding_window", nullptr},
              {"rope_scaling", yarn_config(t.yarn)},
              {"router_aux_loss_coef", 0.02},
              {"tie_word_embeddings", false},
              {"torch_dtype", "float32"}};
}

// config.json as the family's transformers config class writes it (its defaults where the tiny
// model does not decide).
inline json family_config(const Tiny& t) {
  if (t.family == "mixtral") return mixtral_config(t);
  json c{{"model_type", t.family},
         {"vocab_size", t.V},
         {"hidden_size", t.D},
         {"num_hidden_layers", t.L},
         {"num_attention_heads", t.H},
         {"num_key_value_heads", t.KV},
         {"hidden_act", "silu"},
         {"max_position_embeddings", t.max_pos},
         {"initializer_range", 0.02},
         {"rms_norm_eps", t.eps},
         {"use_cache", true},
         {"tie_word_embeddings", false},
         {"rope_theta", t.theta},
         {"rope_scaling", yarn_config(t.yarn)},
         {"attention_dropout", 0.0},
         {"num_experts_per_tok", t.k},
         {"num_experts", t.E},
         {"norm_topk_prob", t.norm_topk},
         {"output_router_logits", false},
         {"router_aux_loss_coef", 0.001},
         {"torch_dtype", "float32"}};
  if (t.family == "olmoe") {
    c["architectures"] = {"OlmoeForCausalLM"};
    c["intermediate_size"] = t.F;  // OLMoE's experts
    c["attention_bias"] = false;
    c["clip_qkv"] = nullptr;
    c["pad_token_id"] = 1;
    c["bos_token_id"] = nullptr;
    c["eos_token_id"] = 50279;
    c["router_aux_loss_coef"] = 0.01;
    return c;
  }
  // Qwen2-MoE and Qwen3-MoE: experts are moe_intermediate_size wide; intermediate_size is the
  // dense MLP of mlp_only_layers (none here).
  c["intermediate_size"] = 4 * t.F;
  c["moe_intermediate_size"] = t.F;
  c["use_sliding_window"] = false;
  c["sliding_window"] = t.family == "qwen2_moe" ? json(4096) : json(nullptr);
  c["max_window_layers"] = 28;
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = json::array();
  if (t.family == "qwen2_moe") {
    c["architectures"] = {"Qwen2MoeForCausalLM"};
    c["shared_expert_intermediate_size"] = t.shared_F;
  } else {
    c["architectures"] = {"Qwen3MoeForCausalLM"};
    c["head_dim"] = t.hd();
    c["attention_bias"] = false;
  }
  return c;
}

// Random weights under HF Mixtral names (per-expert w1/w2/w3), at scales that keep activations
// O(1) and the router's choices well apart.
inline std::map<std::string, Tensor> mixtral_weights(const Tiny& t, uint64_t seed) {
  std::map<std::string, Tensor> w;
  uint64_t s = seed * 1000;
  const float in_scale = 1.0f / std::sqrt(float(t.D));
  auto norm = [&](int64_t n) {
    Tensor x = random_tensor({n}, ++s, 0.1f);
    float* p = x.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] += 1.0f;
    return x;
  };
  w["model.embed_tokens.weight"] = random_tensor({t.V, t.D}, ++s);
  for (int64_t i = 0; i < t.L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    w[p + "input_layernorm.weight"] = norm(t.D);
    w[p + "post_attention_layernorm.weight"] = norm(t.D);
    w[p + "self_attn.q_proj.weight"] = random_tensor({t.H * t.hd(), t.D}, ++s, in_scale);
    w[p + "self_attn.k_proj.weight"] = random_tensor({t.KV * t.hd(), t.D}, ++s, in_scale);
    w[p + "self_attn.v_proj.weight"] = random_tensor({t.KV * t.hd(), t.D}, ++s, in_scale);
    w[p + "self_attn.o_proj.weight"] =
        random_tensor({t.D, t.H * t.hd()}, ++s, 1.0f / std::sqrt(float(t.H * t.hd())));
    w[p + "block_sparse_moe.gate.weight"] = random_tensor({t.E, t.D}, ++s, 3 * in_scale);
    for (int64_t e = 0; e < t.E; ++e) {
      const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      w[x + "w1.weight"] = random_tensor({t.F, t.D}, ++s, in_scale);
      w[x + "w2.weight"] = random_tensor({t.D, t.F}, ++s, 1.0f / std::sqrt(float(t.F)));
      w[x + "w3.weight"] = random_tensor({t.F, t.D}, ++s, in_scale);
    }
  }
  w["model.norm.weight"] = norm(t.D);
  w["lm_head.weight"] = random_tensor({t.V, t.D}, ++s, in_scale);
  return w;
}

// OLMoE / Qwen naming of the same weights: mlp.gate, mlp.experts.E.{gate,up,down}_proj.
inline std::map<std::string, Tensor> olmoe_form(const std::map<std::string, Tensor>& w) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, tensor] : w) {
    std::string n = name;
    auto replace = [&](const std::string& from, const std::string& to) {
      size_t at = n.find(from);
      if (at != std::string::npos) n.replace(at, from.size(), to);
    };
    replace("block_sparse_moe.", "mlp.");
    replace(".w1.weight", ".gate_proj.weight");
    replace(".w3.weight", ".up_proj.weight");
    replace(".w2.weight", ".down_proj.weight");
    out[n] = tensor;
  }
  return out;
}

// Every tensor the family's transformers classes create, with random values: Mixtral's under its
// names; the others' under mlp.* names plus Qwen2-MoE's q/k/v biases, shared expert (Fs wide,
// possibly 0) and its gate [1, D], Qwen3-MoE's q_norm/k_norm [hd], OLMoE's q_norm [H*hd] and
// k_norm [KV*hd].
inline std::map<std::string, Tensor> family_weights(const Tiny& t, uint64_t seed) {
  if (t.family == "mixtral") return mixtral_weights(t, seed);
  std::map<std::string, Tensor> w = olmoe_form(mixtral_weights(t, seed));
  uint64_t s = seed * 1000 + 500;
  auto near_one = [&](int64_t n) {
    Tensor x = random_tensor({n}, ++s, 0.2f);
    float* p = x.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] += 1.0f;
    return x;
  };
  const float in_scale = 1.0f / std::sqrt(float(t.D));
  for (int64_t i = 0; i < t.L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    if (t.family == "qwen2_moe") {
      w[p + "self_attn.q_proj.bias"] = random_tensor({t.H * t.hd()}, ++s, 0.5f);
      w[p + "self_attn.k_proj.bias"] = random_tensor({t.KV * t.hd()}, ++s, 0.5f);
      w[p + "self_attn.v_proj.bias"] = random_tensor({t.KV * t.hd()}, ++s, 0.5f);
      const std::string x = p + "mlp.shared_expert.";
      // A 0-wide shared expert still has (empty) tensors; random_tensor wants elements.
      auto maybe = [&](const Shape& shape, float scale) {
        return t.shared_F > 0 ? random_tensor(shape, ++s, scale) : Tensor::zeros(shape);
      };
      w[x + "gate_proj.weight"] = maybe({t.shared_F, t.D}, in_scale);
      w[x + "up_proj.weight"] = maybe({t.shared_F, t.D}, in_scale);
      w[x + "down_proj.weight"] = maybe({t.D, t.shared_F}, 1.0f);
      w[p + "mlp.shared_expert_gate.weight"] = random_tensor({1, t.D}, ++s, 2 * in_scale);
    } else {
      const bool full = t.family == "olmoe";
      w[p + "self_attn.q_norm.weight"] = near_one(full ? t.H * t.hd() : t.hd());
      w[p + "self_attn.k_norm.weight"] = near_one(full ? t.KV * t.hd() : t.hd());
    }
  }
  return w;
}

// Writes config.json and the tensors: one model.safetensors, or `shards` files named by an index.
inline void write_hf_dir(const std::string& dir, const json& config,
                         const std::map<std::string, Tensor>& tensors, int shards = 1) {
  std::filesystem::create_directories(dir);
  write_file(dir + "/config.json", config.dump(2));
  std::vector<io::NamedTensor> all;
  for (const auto& [name, t] : tensors) all.push_back({name, t, false, {}});
  if (shards == 1) {
    io::write_safetensors(dir + "/model.safetensors", all, {{"format", "pt"}});
    return;
  }
  json weight_map = json::object();
  size_t per = (all.size() + size_t(shards) - 1) / size_t(shards), total = 0;
  for (int s = 0; s < shards; ++s) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, shards);
    std::vector<io::NamedTensor> part(all.begin() + std::min(all.size(), s * per),
                                      all.begin() + std::min(all.size(), (s + 1) * per));
    for (const auto& nt : part) {
      weight_map[nt.name] = file;
      total += nt.tensor.nbytes();
    }
    io::write_safetensors(dir + "/" + file, part, {{"format", "pt"}});
  }
  json index{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file(dir + "/model.safetensors.index.json", index.dump(2));
}

// ---- the reference, in double ----------------------------------------------------------------

inline Vec values(const std::map<std::string, Tensor>& w, const std::string& name) {
  std::vector<float> f = w.at(name).to(DType::f32).to_vector();
  return Vec(f.begin(), f.end());
}

// y = W x (+ b) for W [rows, cols] row-major (nn.Linear).
inline Vec linear(const Vec& W, const Vec& x, int64_t rows, const Vec* bias = nullptr) {
  const int64_t cols = int64_t(x.size());
  Vec y(size_t(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (bias) y[size_t(r)] = (*bias)[size_t(r)];
    for (int64_t c = 0; c < cols; ++c) y[size_t(r)] += W[size_t(r * cols + c)] * x[size_t(c)];
  }
  return y;
}

// RMSNorm of x[0..n) with weight[0..n), in place.
inline void rms_norm_into(double* x, const double* weight, int64_t n, double eps) {
  double ms = 0;
  for (int64_t i = 0; i < n; ++i) ms += x[i] * x[i];
  const double scale = 1.0 / std::sqrt(ms / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = weight[i] * (x[i] * scale);
}

inline Vec rms_norm(Vec x, const Vec& weight, double eps) {
  rms_norm_into(x.data(), weight.data(), int64_t(x.size()), eps);
  return x;
}

// HF's apply_rotary_pos_emb on one head: x * cos + rotate_half(x) * sin, with
// cos/sin = cat(freqs, freqs), freqs[i] = position * theta^(-2i/hd), rotate_half(x) = cat(-x2, x1).
// With YaRN (yarn.on()) freqs[i] = position * yarn.inv_freq(i) and cos/sin times yarn.rope_gain().
inline void hf_rotary(double* x, int64_t hd, int64_t position, double theta,
                      const YarnRef& yarn = {}) {
  const int64_t half = hd / 2;
  Vec rotated(static_cast<size_t>(hd)), out(static_cast<size_t>(hd));
  for (int64_t j = 0; j < hd; ++j) rotated[size_t(j)] = j < half ? -x[j + half] : x[j - half];
  for (int64_t j = 0; j < hd; ++j) {
    const double freq =
        yarn.on() ? double(position) * yarn.inv_freq(j % half, hd, theta)
                  : double(position) / std::pow(theta, double(2 * (j % half)) / double(hd));
    const double g = yarn.rope_gain();
    out[size_t(j)] = g * (x[j] * std::cos(freq) + rotated[size_t(j)] * std::sin(freq));
  }
  for (int64_t j = 0; j < hd; ++j) x[j] = out[size_t(j)];
}

// down(silu(gate x) * up x), the SwiGLU of an expert or of the shared expert.
inline Vec swiglu(const Vec& gate, const Vec& up, const Vec& down, const Vec& x, int64_t F,
                  int64_t D) {
  Vec a = linear(gate, x, F), u = linear(up, x, F);
  for (int64_t f = 0; f < F; ++f) {
    const double g = a[size_t(f)];
    a[size_t(f)] = g / (1.0 + std::exp(-g)) * u[size_t(f)];
  }
  return linear(down, a, D);
}

// The optional tensor `name` (empty when the checkpoint lacks it).
inline Vec optional(const std::map<std::string, Tensor>& w, const std::string& name) {
  return w.count(name) ? values(w, name) : Vec{};
}

// Logits [B*T, V] of the family's *ForCausalLM for ids [B, T], from HF-named tensors: Mixtral
// (block_sparse_moe.*) or mlp.* naming; q/k/v biases, qk-norm (per head when the weight is hd
// long, else over the whole projection, as OLMoE) and the gated shared expert wherever their
// tensors are present. `normalize`: renormalise the top-k probabilities (norm_topk_prob).
inline Vec hf_reference_logits(const Tiny& t, const std::map<std::string, Tensor>& w,
                               const std::vector<int32_t>& ids, int64_t B, int64_t T,
                               bool normalize) {
  const int64_t D = t.D, hd = t.hd(), n_rep = t.H / t.KV, QW = t.H * hd, KW = t.KV * hd;
  const Vec embed = values(w, "model.embed_tokens.weight");
  std::vector<Vec> h(size_t(B * T));
  for (int64_t r = 0; r < B * T; ++r)
    h[size_t(r)] =
        Vec(embed.begin() + ids[size_t(r)] * D, embed.begin() + (ids[size_t(r)] + 1) * D);
  for (int64_t l = 0; l < t.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const bool mixtral_names = w.count(p + "block_sparse_moe.gate.weight") > 0;
    const std::string moe = p + (mixtral_names ? "block_sparse_moe." : "mlp.");
    const Vec ln1 = values(w, p + "input_layernorm.weight"),
              ln2 = values(w, p + "post_attention_layernorm.weight");
    const Vec Wq = values(w, p + "self_attn.q_proj.weight"),
              Wk = values(w, p + "self_attn.k_proj.weight");
    const Vec Wv = values(w, p + "self_attn.v_proj.weight"),
              Wo = values(w, p + "self_attn.o_proj.weight");
    const Vec bq = optional(w, p + "self_attn.q_proj.bias"),
              bk = optional(w, p + "self_attn.k_proj.bias"),
              bv = optional(w, p + "self_attn.v_proj.bias");
    const Vec q_norm = optional(w, p + "self_attn.q_norm.weight"),
              k_norm = optional(w, p + "self_attn.k_norm.weight");
    const Vec Wg = values(w, moe + "gate.weight");
    auto with = [](const Vec& b) { return b.empty() ? nullptr : &b; };
    // qk-norm: per head (Qwen3-MoE: the weight is hd long, shared by the heads) or over the whole
    // projection (OLMoE), before RoPE.
    auto qk_norm = [&](Vec& x, const Vec& weight, int64_t heads) {
      if (weight.empty()) return;
      if (int64_t(weight.size()) == hd)
        for (int64_t head = 0; head < heads; ++head)
          rms_norm_into(&x[size_t(head * hd)], weight.data(), hd, t.eps);
      else
        rms_norm_into(x.data(), weight.data(), int64_t(x.size()), t.eps);
    };
    std::vector<Vec> q(size_t(B * T)), k(size_t(B * T)), v(size_t(B * T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < T; ++s) {
        const size_t r = size_t(b * T + s);
        Vec x = rms_norm(h[r], ln1, t.eps);
        q[r] = linear(Wq, x, QW, with(bq));
        k[r] = linear(Wk, x, KW, with(bk));
        v[r] = linear(Wv, x, KW, with(bv));
        qk_norm(q[r], q_norm, t.H);
        qk_norm(k[r], k_norm, t.KV);
        for (int64_t head = 0; head < t.H; ++head)
          hf_rotary(&q[r][size_t(head * hd)], hd, s, t.theta, t.yarn);
        for (int64_t head = 0; head < t.KV; ++head)
          hf_rotary(&k[r][size_t(head * hd)], hd, s, t.theta, t.yarn);
      }
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < T; ++s) {
        const size_t r = size_t(b * T + s);
        Vec ctx(size_t(QW), 0.0);
        for (int64_t head = 0; head < t.H; ++head) {
          const int64_t kv = head / n_rep;  // repeat_kv: each kv head serves n_rep query heads
          Vec scores(size_t(s + 1));
          double top = -1e300;
          const int64_t window = t.window_of(l);
          for (int64_t u = 0; u <= s; ++u) {
            if (window > 0 && u <= s - window) {  // outside the window: exp(-inf) = 0
              scores[size_t(u)] = -INFINITY;
              continue;
            }
            double dot = 0;
            for (int64_t j = 0; j < hd; ++j)
              dot += q[r][size_t(head * hd + j)] * k[size_t(b * T + u)][size_t(kv * hd + j)];
            scores[size_t(u)] = dot / std::sqrt(double(hd));
            top = std::max(top, scores[size_t(u)]);
          }
          double sum = 0;
          for (double& sc : scores) sum += (sc = std::exp(sc - top));
          for (int64_t u = 0; u <= s; ++u)
            for (int64_t j = 0; j < hd; ++j)
              ctx[size_t(head * hd + j)] +=
                  scores[size_t(u)] / sum * v[size_t(b * T + u)][size_t(kv * hd + j)];
        }
        Vec attn = linear(Wo, ctx, D);
        for (int64_t i = 0; i < D; ++i) h[r][size_t(i)] += attn[size_t(i)];
      }
    const std::string shared = moe + "shared_expert.";
    const bool has_shared = w.count(shared + "gate_proj.weight") && t.shared_F > 0;
    for (int64_t r = 0; r < B * T; ++r) {
      Vec x = rms_norm(h[size_t(r)], ln2, t.eps);
      Vec logits = linear(Wg, x, t.E);
      double top = *std::max_element(logits.begin(), logits.end()), sum = 0;
      Vec probs(logits.size());
      for (size_t e = 0; e < logits.size(); ++e) sum += (probs[e] = std::exp(logits[e] - top));
      for (double& pr : probs) pr /= sum;
      std::vector<int64_t> chosen;
      for (int64_t j = 0; j < t.k; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < t.E; ++e)
          if (std::find(chosen.begin(), chosen.end(), e) == chosen.end() &&
              (best < 0 || probs[size_t(e)] > probs[size_t(best)]))
            best = e;
        chosen.push_back(best);
      }
      double chosen_sum = 0;
      for (int64_t e : chosen) chosen_sum += probs[size_t(e)];
      for (int64_t e : chosen) {
        const double gate = normalize ? probs[size_t(e)] / chosen_sum : probs[size_t(e)];
        const std::string x_name = moe + "experts." + std::to_string(e) + ".";
        const Vec y = mixtral_names
                          ? swiglu(values(w, x_name + "w1.weight"), values(w, x_name + "w3.weight"),
                                   values(w, x_name + "w2.weight"), x, t.F, D)
                          : swiglu(values(w, x_name + "gate_proj.weight"),
                                   values(w, x_name + "up_proj.weight"),
                                   values(w, x_name + "down_proj.weight"), x, t.F, D);
        for (int64_t i = 0; i < D; ++i) h[size_t(r)][size_t(i)] += gate * y[size_t(i)];
      }
      if (has_shared) {  // Qwen2-MoE: sigmoid(x . w_gate) * shared_expert(x), added
        const Vec y =
            swiglu(values(w, shared + "gate_proj.weight"), values(w, shared + "up_proj.weight"),
                   values(w, shared + "down_proj.weight"), x, t.shared_F, D);
        const double g = linear(values(w, moe + "shared_expert_gate.weight"), x, 1)[0];
        const double gate = 1.0 / (1.0 + std::exp(-g));
        for (int64_t i = 0; i < D; ++i) h[size_t(r)][size_t(i)] += gate * y[size_t(i)];
      }
    }
  }
  const Vec final_norm = values(w, "model.norm.weight"),
            head = values(w, t.tied ? "model.embed_tokens.weight" : "lm_head.weight");
  Vec out;
  for (int64_t r = 0; r < B * T; ++r) {
    Vec logits = linear(head, rms_norm(h[size_t(r)], final_norm, t.eps), t.V);
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

// ---- comparing -------------------------------------------------------------------------------

// Our logits [B*T, V]: the checkpoint saved as a file and loaded the way moe-infer loads models.
inline std::vector<float> our_logits(const io::Checkpoint& ckpt, const std::string& path,
                                     const std::vector<int32_t>& ids, int64_t B, int64_t T) {
  io::save_checkpoint(path, ckpt);
  infer::LoadedModel m = infer::load_model(path);
  return m.model->logits(Tensor::from_vector({B, T}, ids)).to_vector();
}

// max |a - b| / max |b|.
inline double relative_error(const std::vector<float>& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  REQUIRE(scale > 0.1);  // logits far from zero: the comparison means something
  return diff / scale;
}

// max |a - b| / max |b| over two references.
inline double relative_gap(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

inline const io::NamedTensor& param(const io::Checkpoint& c, const std::string& name) {
  for (const auto& p : c.params)
    if (p.name == name) return p;
  FAIL("no parameter " << name);
  throw 0;
}

inline void require_same_params(const io::Checkpoint& a, const io::Checkpoint& b) {
  REQUIRE(a.params.size() == b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    INFO("parameter " << a.params[i].name);
    REQUIRE(a.params[i].name == b.params[i].name);
    REQUIRE(a.params[i].expert == b.params[i].expert);
    REQUIRE(same_bytes(a.params[i].tensor, b.params[i].tensor));
  }
}

inline std::vector<int32_t> random_token_ids(int64_t n, int32_t vocab, uint64_t seed) {
  Tensor t = random_ids({n}, seed, vocab);
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + n);
}

}  // namespace moe::test::hf
