// A tiny gpt-oss checkpoint (transformers' GptOssForCausalLM: gpt-oss-20b, gpt-oss-120b) for the
// import/export tests, in f32, in bf16 (norms kept F32, as save_pretrained writes the
// _keep_in_fp32_modules), and with MXFP4 experts (_blocks/_scales + quantization_config, as the
// released checkpoints); a test-side MXFP4 dequantiser written from the format (never from our
// quant_blocks); and an independent double-precision reference of the forward pass written from
// transformers' modeling_gpt_oss.py, never from our layers:
//   attention:  RMSNorm -> q/k/v with biases -> RoPE (NeoX halves, YaRN with truncate false) ->
//               causal GQA logits q k^T / sqrt(hd), keys j > i - sliding_window on the sliding
//               layers; each head's sink logit (unscaled) joins the softmax and is dropped after
//               it -> o with a bias.
//   MoE:        logits = x W_r^T + b_r; the top-k logits, softmax over those k; per chosen expert
//               gate_up = x @ W_gu[e] + b_gu[e] ([D, 2F]: gate = columns ::2, up = 1::2),
//               g = min(gate, limit), u = clamp(up, -limit, limit),
//               out = ((u + 1) * g * sigmoid(alpha g)) @ W_d[e] + b_d[e] ([F, D]).
// Shape letters: V vocabulary, D hidden, H heads, KV kv heads, hd head dim, F expert hidden,
// E experts, k top-k, L layers, B batch, T sequence.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "support/hf_families.h"

namespace moe::test::hf {

struct TinyGptOss {
  int64_t V = 256, D = 64, H = 4, KV = 2, hd = 32, F = 32, L = 3, E = 4, k = 2;
  int64_t window = 4;  // sliding_window
  // layer_types written to config.json; empty: none written (transformers' default: layer i
  // slides iff i is even). `sliding(l)` is what the model does either way.
  std::vector<std::string> layer_types;
  double alpha = 1.702, limit = 7.0, theta = 150000, eps = 1e-5;
  YarnRef yarn = gpt_oss_yarn();
  int64_t max_pos = 4096;  // = factor * original, so transformers' YaRN factor is `factor` itself
  bool write_rope = true;  // false: no rope_parameters key (transformers' default dict applies)

  static YarnRef gpt_oss_yarn() {  // gpt-oss's dict, with a context of 128 instead of 4096
    YarnRef y;
    y.factor = 32, y.original = 128, y.beta_fast = 32, y.beta_slow = 1, y.truncate = false;
    return y;
  }
  bool sliding(int64_t l) const {
    if (layer_types.empty()) return l % 2 == 0;
    return layer_types[size_t(l)] == "sliding_attention";
  }
};

// config.json as transformers 5.25's GptOssConfig writes it (rope_parameters holding rope_theta).
inline json gpt_oss_config(const TinyGptOss& t) {
  json c{{"architectures", {"GptOssForCausalLM"}},
         {"model_type", "gpt_oss"},
         {"vocab_size", t.V},
         {"hidden_size", t.D},
         {"intermediate_size", t.F},
         {"num_hidden_layers", t.L},
         {"num_attention_heads", t.H},
         {"num_key_value_heads", t.KV},
         {"head_dim", t.hd},
         {"num_local_experts", t.E},
         {"num_experts_per_tok", t.k},
         {"sliding_window", t.window},
         {"hidden_act", "silu"},
         {"max_position_embeddings", t.max_pos},
         {"initializer_range", 0.02},
         {"rms_norm_eps", t.eps},
         {"use_cache", true},
         {"tie_word_embeddings", false},
         {"attention_bias", true},
         {"attention_dropout", 0.0},
         {"router_aux_loss_coef", 0.001},
         {"output_router_logits", false},
         {"swiglu_alpha", t.alpha},
         {"swiglu_limit", t.limit},
         {"torch_dtype", "float32"}};
  if (!t.layer_types.empty()) c["layer_types"] = t.layer_types;
  if (t.write_rope) {
    json r = yarn_config(t.yarn);
    r["truncate"] = t.yarn.truncate;
    r["rope_theta"] = t.theta;
    c["rope_parameters"] = r;
  }
  return c;
}

// The same config with quantization_config as the released MXFP4 checkpoints carry it.
inline json gpt_oss_mxfp4_config(const TinyGptOss& t) {
  json c = gpt_oss_config(t);
  c["torch_dtype"] = "bfloat16";
  c["quantization_config"] = {
      {"quant_method", "mxfp4"},
      {"modules_to_not_convert",
       {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}};
  return c;
}

inline bool gpt_oss_norm(const std::string& name) {
  return name.ends_with("layernorm.weight") || name == "model.norm.weight";
}

// Every tensor GptOssForCausalLM creates, at scales that keep activations O(1); the sinks and
// biases large enough that each matters. `dtype` f32 or bf16; the norms stay F32 either way
// (holding values of `dtype`, as a model trained in it saved by transformers).
inline std::map<std::string, Tensor> gpt_oss_weights(const TinyGptOss& t, uint64_t seed,
                                                     DType dtype = DType::f32) {
  std::map<std::string, Tensor> w;
  uint64_t s = seed * 1000;
  const float in_scale = 1.0f / std::sqrt(float(t.D));
  auto near_one = [&](int64_t n) {
    Tensor x = random_tensor({n}, ++s, 0.2f);
    float* p = x.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] += 1.0f;
    return x;
  };
  w["model.embed_tokens.weight"] = random_tensor({t.V, t.D}, ++s);
  for (int64_t i = 0; i < t.L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    w[p + "input_layernorm.weight"] = near_one(t.D);
    w[p + "post_attention_layernorm.weight"] = near_one(t.D);
    const std::string a = p + "self_attn.";
    w[a + "q_proj.weight"] = random_tensor({t.H * t.hd, t.D}, ++s, in_scale);
    w[a + "k_proj.weight"] = random_tensor({t.KV * t.hd, t.D}, ++s, in_scale);
    w[a + "v_proj.weight"] = random_tensor({t.KV * t.hd, t.D}, ++s, in_scale);
    w[a + "o_proj.weight"] =
        random_tensor({t.D, t.H * t.hd}, ++s, 1.0f / std::sqrt(float(t.H * t.hd)));
    w[a + "q_proj.bias"] = random_tensor({t.H * t.hd}, ++s, 0.5f);
    w[a + "k_proj.bias"] = random_tensor({t.KV * t.hd}, ++s, 0.5f);
    w[a + "v_proj.bias"] = random_tensor({t.KV * t.hd}, ++s, 0.5f);
    w[a + "o_proj.bias"] = random_tensor({t.D}, ++s, 0.5f);
    w[a + "sinks"] = random_tensor({t.H}, ++s, 1.0f);
    const std::string m = p + "mlp.";
    w[m + "router.weight"] = random_tensor({t.E, t.D}, ++s, 3 * in_scale);
    w[m + "router.bias"] = random_tensor({t.E}, ++s, 1.0f);
    w[m + "experts.gate_up_proj"] = random_tensor({t.E, t.D, 2 * t.F}, ++s, in_scale);
    w[m + "experts.gate_up_proj_bias"] = random_tensor({t.E, 2 * t.F}, ++s, 0.5f);
    w[m + "experts.down_proj"] = random_tensor({t.E, t.F, t.D}, ++s, 1.0f / std::sqrt(float(t.F)));
    w[m + "experts.down_proj_bias"] = random_tensor({t.E, t.D}, ++s, 0.5f);
  }
  w["model.norm.weight"] = near_one(t.D);
  w["lm_head.weight"] = random_tensor({t.V, t.D}, ++s, in_scale);
  if (dtype != DType::f32)  // norms: values of `dtype` (as trained in it), stored F32
    for (auto& [name, tensor] : w)
      tensor = gpt_oss_norm(name) ? tensor.to(dtype).to(DType::f32) : tensor.to(dtype);
  return w;
}

// ---- MXFP4 (transformers' integrations/mxfp4.py) ----------------------------------------------

// E2M1 code -> value: sign in bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6.
inline double fp4_value(int code) {
  static const double magnitude[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (code & 8) ? -magnitude[code & 7] : magnitude[code & 7];
}

// _convert_moe_packed_tensors: blocks U8 [E, rows, in/32, 16] and scales U8 [E, rows, in/32]
// (rows = output features, 32 inputs a block; byte j of a block holds element 2j in its low
// nibble and 2j+1 in its high one; value = fp4 * 2^(scale - 127)) -> [E, in, rows] in `dtype`
// (transposed, the layout of the unquantised gate_up_proj / down_proj). The power of two is
// computed in f32 as torch.ldexp does: a scale of 255 gives 2^128 = inf, so every value is inf
// (or NaN for a zero code), as in transformers.
inline Tensor hf_mxfp4_dequantize(const Tensor& blocks, const Tensor& scales, DType dtype) {
  const int64_t E = blocks.dim(0), rows = blocks.dim(1), nb = blocks.dim(2), in = nb * 32;
  const uint8_t* b = blocks.data<uint8_t>();
  const uint8_t* sc = scales.data<uint8_t>();
  std::vector<float> out(size_t(E * in * rows));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t blk = 0; blk < nb; ++blk) {
        const float scale = std::ldexp(1.0f, int(sc[(e * rows + r) * nb + blk]) - 127);
        for (int64_t j = 0; j < 16; ++j) {
          const uint8_t byte = b[((e * rows + r) * nb + blk) * 16 + j];
          for (int64_t half = 0; half < 2; ++half) {
            const int64_t i = blk * 32 + 2 * j + half;
            const int code = half ? byte >> 4 : byte & 15;
            out[size_t((e * in + i) * rows + r)] = float(fp4_value(code)) * scale;
          }
        }
      }
  return Tensor::from_vector({E, in, rows}, out).to(dtype);
}

// Random MXFP4 bytes for a [E, rows, in] weight: uniform nibbles, scales in [120, 126] (values
// up to 3, down to 2^-8).
inline std::pair<Tensor, Tensor> random_mxfp4(int64_t E, int64_t rows, int64_t in, uint64_t seed) {
  Tensor blocks = Tensor::empty({E, rows, in / 32, 16}, DType::u8);
  Tensor scales = Tensor::empty({E, rows, in / 32}, DType::u8);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&] {  // splitmix64
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (int64_t i = 0; i < blocks.numel(); ++i) blocks.data<uint8_t>()[i] = uint8_t(next());
  for (int64_t i = 0; i < scales.numel(); ++i)
    scales.data<uint8_t>()[i] = uint8_t(120 + next() % 7);
  return {blocks, scales};
}

// The released form: gpt_oss_weights in bf16 with each layer's gate_up_proj / down_proj replaced
// by random MXFP4 _blocks / _scales (in and F multiples of 32).
inline std::map<std::string, Tensor> gpt_oss_mxfp4(const TinyGptOss& t, uint64_t seed) {
  std::map<std::string, Tensor> w = gpt_oss_weights(t, seed, DType::bf16);
  for (int64_t i = 0; i < t.L; ++i) {
    const std::string x = "model.layers." + std::to_string(i) + ".mlp.experts.";
    w.erase(x + "gate_up_proj");
    w.erase(x + "down_proj");
    auto [gu_b, gu_s] = random_mxfp4(t.E, 2 * t.F, t.D, seed * 100 + uint64_t(2 * i));
    auto [d_b, d_s] = random_mxfp4(t.E, t.D, t.F, seed * 100 + uint64_t(2 * i + 1));
    w[x + "gate_up_proj_blocks"] = gu_b, w[x + "gate_up_proj_scales"] = gu_s;
    w[x + "down_proj_blocks"] = d_b, w[x + "down_proj_scales"] = d_s;
  }
  return w;
}

// What transformers loads from the MXFP4 form with dequantize=True: every _blocks/_scales pair
// replaced by its dense tensor in `dtype`.
inline std::map<std::string, Tensor> gpt_oss_dequantized(const std::map<std::string, Tensor>& w,
                                                         DType dtype = DType::bf16) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, tensor] : w) {
    if (name.ends_with("_scales")) continue;
    if (!name.ends_with("_blocks")) {
      out[name] = tensor;
      continue;
    }
    const std::string base = name.substr(0, name.size() - 7);
    out[base] = hf_mxfp4_dequantize(tensor, w.at(base + "_scales"), dtype);
  }
  return out;
}

// ---- the reference, in double ----------------------------------------------------------------

// GptOssAttention of layer `p` over the whole batch, added into h.
inline void gpt_oss_attention(const TinyGptOss& t, const std::map<std::string, Tensor>& w,
                              const std::string& p, int64_t layer, std::vector<Vec>& h, int64_t B,
                              int64_t T) {
  const int64_t hd = t.hd, QW = t.H * hd, KW = t.KV * hd, n_rep = t.H / t.KV;
  const std::string a = p + "self_attn.";
  const Vec ln1 = values(w, p + "input_layernorm.weight");
  const Vec bq = values(w, a + "q_proj.bias"), bk = values(w, a + "k_proj.bias"),
            bv = values(w, a + "v_proj.bias"), bo = values(w, a + "o_proj.bias");
  const Vec sinks = values(w, a + "sinks");
  std::vector<Vec> q(size_t(B * T)), k(size_t(B * T)), v(size_t(B * T));
  for (int64_t r = 0; r < B * T; ++r) {
    const Vec x = rms_norm(h[size_t(r)], ln1, t.eps);
    q[size_t(r)] = linear(values(w, a + "q_proj.weight"), x, QW, &bq);
    k[size_t(r)] = linear(values(w, a + "k_proj.weight"), x, KW, &bk);
    v[size_t(r)] = linear(values(w, a + "v_proj.weight"), x, KW, &bv);
    for (int64_t head = 0; head < t.H; ++head)
      hf_rotary(&q[size_t(r)][size_t(head * hd)], hd, r % T, t.theta, t.yarn);
    for (int64_t head = 0; head < t.KV; ++head)
      hf_rotary(&k[size_t(r)][size_t(head * hd)], hd, r % T, t.theta, t.yarn);
  }
  const int64_t window = t.sliding(layer) ? t.window : 0;
  const Vec Wo = values(w, a + "o_proj.weight");
  for (int64_t r = 0; r < B * T; ++r) {
    const int64_t s = r % T, first = r - s;  // causal within the row's sequence
    const int64_t from = window > 0 ? std::max<int64_t>(0, s - window + 1) : 0;
    Vec ctx(size_t(QW), 0.0);
    for (int64_t head = 0; head < t.H; ++head) {
      const int64_t kv = head / n_rep;
      Vec scores;
      for (int64_t u = from; u <= s; ++u) {
        double dot = 0;
        for (int64_t j = 0; j < hd; ++j)
          dot += q[size_t(r)][size_t(head * hd + j)] * k[size_t(first + u)][size_t(kv * hd + j)];
        scores.push_back(dot / std::sqrt(double(hd)));
      }
      const double sink = sinks[size_t(head)];
      const double top = std::max(sink, *std::max_element(scores.begin(), scores.end()));
      double sum = std::exp(sink - top);  // the sink's column: in the sum, then dropped
      for (double& sc : scores) sum += (sc = std::exp(sc - top));
      for (int64_t u = from; u <= s; ++u)
        for (int64_t j = 0; j < hd; ++j)
          ctx[size_t(head * hd + j)] +=
              scores[size_t(u - from)] / sum * v[size_t(first + u)][size_t(kv * hd + j)];
    }
    const Vec out = linear(Wo, ctx, t.D, &bo);
    for (int64_t i = 0; i < t.D; ++i) h[size_t(r)][size_t(i)] += out[size_t(i)];
  }
}

// GptOssMLP of layer `p` for one normalised token x.
inline Vec gpt_oss_mlp(const TinyGptOss& t, const std::map<std::string, Tensor>& w,
                       const std::string& p, const Vec& x) {
  const std::string m = p + "mlp.";
  const Vec br = values(w, m + "router.bias");
  const Vec logits = linear(values(w, m + "router.weight"), x, t.E, &br);
  std::vector<int64_t> order(size_t(t.E));
  for (int64_t e = 0; e < t.E; ++e) order[size_t(e)] = e;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  const double top = logits[size_t(order[0])];
  double sum = 0;
  for (int64_t j = 0; j < t.k; ++j) sum += std::exp(logits[size_t(order[size_t(j)])] - top);
  const Vec gu = values(w, m + "experts.gate_up_proj"),
            gub = values(w, m + "experts.gate_up_proj_bias");
  const Vec dn = values(w, m + "experts.down_proj"), dnb = values(w, m + "experts.down_proj_bias");
  const int64_t F2 = 2 * t.F;
  Vec out(size_t(t.D), 0.0);
  for (int64_t j = 0; j < t.k; ++j) {
    const int64_t e = order[size_t(j)];
    const double weight = std::exp(logits[size_t(e)] - top) / sum;
    Vec act(size_t(t.F));
    for (int64_t f = 0; f < t.F; ++f) {
      double gate = gub[size_t(e * F2 + 2 * f)], up = gub[size_t(e * F2 + 2 * f + 1)];
      for (int64_t d = 0; d < t.D; ++d) {
        gate += x[size_t(d)] * gu[size_t((e * t.D + d) * F2 + 2 * f)];
        up += x[size_t(d)] * gu[size_t((e * t.D + d) * F2 + 2 * f + 1)];
      }
      gate = std::min(gate, t.limit);
      up = std::clamp(up, -t.limit, t.limit);
      act[size_t(f)] = (up + 1.0) * gate / (1.0 + std::exp(-t.alpha * gate));
    }
    for (int64_t d = 0; d < t.D; ++d) {
      double y = dnb[size_t(e * t.D + d)];
      for (int64_t f = 0; f < t.F; ++f) y += act[size_t(f)] * dn[size_t((e * t.F + f) * t.D + d)];
      out[size_t(d)] += weight * y;
    }
  }
  return out;
}

// Logits [B*T, V] of GptOssForCausalLM for ids [B, T], from dense (unquantised) tensors: pass an
// MXFP4 form through gpt_oss_dequantized first.
inline Vec gpt_oss_reference_logits(const TinyGptOss& t, const std::map<std::string, Tensor>& w,
                                    const std::vector<int32_t>& ids, int64_t B, int64_t T) {
  const Vec embed = values(w, "model.embed_tokens.weight");
  std::vector<Vec> h(size_t(B * T));
  for (int64_t r = 0; r < B * T; ++r)
    h[size_t(r)] =
        Vec(embed.begin() + ids[size_t(r)] * t.D, embed.begin() + (ids[size_t(r)] + 1) * t.D);
  for (int64_t l = 0; l < t.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    gpt_oss_attention(t, w, p, l, h, B, T);
    const Vec ln2 = values(w, p + "post_attention_layernorm.weight");
    for (int64_t r = 0; r < B * T; ++r) {
      const Vec y = gpt_oss_mlp(t, w, p, rms_norm(h[size_t(r)], ln2, t.eps));
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
