// DeepSeek-V3's Multi-head Latent Attention (transformers' DeepseekV3Attention, DeepSeek-V2's
// DeepseekV2Attention) as an independent double-precision reference written from the published
// math (the DeepSeek-V2 paper, section 2.1, and modeling_deepseek_v3.py), never from our layers,
// on tensors named as transformers names them:
//   q = q_b_proj(RMSNorm(q_a_proj(x))) (q_a_layernorm), or q_proj(x) without q_lora_rank;
//       each head [q_nope (qk_nope) | q_pe (qk_rope)].
//   kv_a_proj_with_mqa(x) = [c (kv_lora_rank) | k_pe (qk_rope)]; kv_b_proj(RMSNorm(c))
//       (kv_a_layernorm) = each head [k_nope (qk_nope) | v (v_head_dim)]; k_pe one for all heads.
//   RoPE on q_pe and k_pe, interleaved (rope_interleave, DeepSeek's own code): pairs (2i, 2i+1)
//       rotated by position * theta^(-2i/qk_rope). (transformers reorders each vector to
//       [evens | odds] and rotates halves: the same dot products.)
//   (YaRN, when on: Yarn below.)
//   scores (q_nope . k_nope + q_pe . k_pe) / sqrt(qk_nope + qk_rope), causal softmax, context of
//   v per head, o_proj [D, H*v_head_dim].
// And the map from those tensors to our layer's params (nn/mla.h): each head's q rows RoPE part
// first in halves order, kv_a_proj_with_mqa split into kv_a and k_rope, kv_b_proj into k_b, v_b.
// Shape letters: N tokens, D hidden, H heads, r q_lora_rank, c kv_lora_rank, dn qk_nope, dr
// qk_rope, dv v_head_dim.
#pragma once
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "moe/nn/mla.h"
#include "moe/param.h"
#include "moe/tensor.h"
#include "support/gradcheck.h"
#include "support/yarn_reference.h"

namespace moe::test::dsv3 {

using Vec = std::vector<double>;
using Weights = std::map<std::string, Tensor>;  // HF names without "model.layers.<i>.self_attn."

// YaRN (factor 0: none): support/yarn_reference.h; the scores of DeepSeek's attention are
// multiplied by its score_gain().
using Yarn = test::YarnRef;

struct MlaShape {
  int64_t D = 12, H = 3, r = 8, c = 6, dn = 4, dr = 4, dv = 2;
  double theta = 50, eps = 1e-6;
  bool interleaved = true;  // rope_interleave; false: RoPE on halves (rotate_half)
  Yarn yarn;
  int64_t qhd() const { return dn + dr; }
};

// Every tensor DeepseekV3Attention creates, random, at scales that keep activations O(1).
inline Weights mla_weights(const MlaShape& s, uint64_t seed) {
  Weights w;
  uint64_t k = seed * 100;
  auto near_one = [&](int64_t n) {
    Tensor x = random_tensor({n}, ++k, 0.3f);
    for (int64_t i = 0; i < n; ++i) x.data<float>()[i] += 1.0f;
    return x;
  };
  auto scale = [](int64_t in) { return 1.5f / std::sqrt(float(in)); };
  if (s.r > 0) {
    w["q_a_proj.weight"] = random_tensor({s.r, s.D}, ++k, scale(s.D));
    w["q_a_layernorm.weight"] = near_one(s.r);
    w["q_b_proj.weight"] = random_tensor({s.H * s.qhd(), s.r}, ++k, scale(s.r));
  } else {
    w["q_proj.weight"] = random_tensor({s.H * s.qhd(), s.D}, ++k, scale(s.D));
  }
  w["kv_a_proj_with_mqa.weight"] = random_tensor({s.c + s.dr, s.D}, ++k, scale(s.D));
  w["kv_a_layernorm.weight"] = near_one(s.c);
  w["kv_b_proj.weight"] = random_tensor({s.H * (s.dn + s.dv), s.c}, ++k, scale(s.c));
  w["o_proj.weight"] = random_tensor({s.D, s.H * s.dv}, ++k, scale(s.H * s.dv));
  return w;
}

inline Vec vals(const Weights& w, const std::string& name) {
  const std::vector<float> f = w.at(name).to_vector();
  return Vec(f.begin(), f.end());
}

inline Vec mat_vec(const Vec& W, const Vec& x, int64_t rows) {
  const int64_t cols = int64_t(x.size());
  Vec y(size_t(rows), 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) y[size_t(i)] += W[size_t(i * cols + j)] * x[size_t(j)];
  return y;
}

inline void rms_in_place(double* x, const Vec& weight, int64_t n, double eps) {
  double ms = 0;
  for (int64_t i = 0; i < n; ++i) ms += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ms / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = weight[size_t(i)] * x[i] * inv;
}

// DeepSeek's interleaved rotary embedding of x[0..d) at `position` (YaRN's when y.on()).
inline void rotate_interleaved(double* x, int64_t d, int64_t position, double theta,
                               const Yarn& y = {}) {
  for (int64_t i = 0; i < d / 2; ++i) {
    const double angle = double(position) * y.inv_freq(i, d, theta), g = y.rope_gain();
    const double a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = g * (a * std::cos(angle) - b * std::sin(angle));
    x[2 * i + 1] = g * (b * std::cos(angle) + a * std::sin(angle));
  }
}

// Rotate-half RoPE of x[0..d) (rope_interleave false): pairs (i, i + d/2).
inline void rotate_halves(double* x, int64_t d, int64_t position, double theta,
                          const Yarn& y = {}) {
  for (int64_t i = 0; i < d / 2; ++i) {
    const double angle = double(position) * y.inv_freq(i, d, theta), g = y.rope_gain();
    const double a = x[i], b = x[i + d / 2];
    x[i] = g * (a * std::cos(angle) - b * std::sin(angle));
    x[i + d / 2] = g * (b * std::cos(angle) + a * std::sin(angle));
  }
}

// The layer's output [B*T, D] for input x [B*T, D] (B windows of T, each causal from position 0).
inline Vec mla_reference(const MlaShape& s, const Weights& w, const Vec& x, int64_t B, int64_t T) {
  const int64_t N = B * T, hd = s.qhd();
  std::vector<Vec> q(static_cast<size_t>(N)), k_pe(q.size()), kv(q.size());
  for (int64_t n = 0; n < N; ++n) {
    const Vec xn(x.begin() + n * s.D, x.begin() + (n + 1) * s.D);
    if (s.r > 0) {
      Vec cq = mat_vec(vals(w, "q_a_proj.weight"), xn, s.r);
      rms_in_place(cq.data(), vals(w, "q_a_layernorm.weight"), s.r, s.eps);
      q[size_t(n)] = mat_vec(vals(w, "q_b_proj.weight"), cq, s.H * hd);
    } else {
      q[size_t(n)] = mat_vec(vals(w, "q_proj.weight"), xn, s.H * hd);
    }
    Vec ckv = mat_vec(vals(w, "kv_a_proj_with_mqa.weight"), xn, s.c + s.dr);
    k_pe[size_t(n)] = Vec(ckv.begin() + s.c, ckv.end());
    Vec c(ckv.begin(), ckv.begin() + s.c);
    rms_in_place(c.data(), vals(w, "kv_a_layernorm.weight"), s.c, s.eps);
    kv[size_t(n)] = mat_vec(vals(w, "kv_b_proj.weight"), c, s.H * (s.dn + s.dv));
    const int64_t pos = n % T;
    const auto rotate = s.interleaved ? rotate_interleaved : rotate_halves;
    for (int64_t h = 0; h < s.H; ++h)
      rotate(&q[size_t(n)][size_t(h * hd + s.dn)], s.dr, pos, s.theta, s.yarn);
    rotate(k_pe[size_t(n)].data(), s.dr, pos, s.theta, s.yarn);
  }
  const Vec Wo = vals(w, "o_proj.weight");
  Vec out;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t first = n - n % T;
    Vec ctx(size_t(s.H * s.dv), 0.0);
    for (int64_t h = 0; h < s.H; ++h) {
      const double* qh = &q[size_t(n)][size_t(h * hd)];
      Vec scores;
      for (int64_t u = first; u <= n; ++u) {
        const double* kn = &kv[size_t(u)][size_t(h * (s.dn + s.dv))];
        double dot = 0;
        for (int64_t j = 0; j < s.dn; ++j) dot += qh[j] * kn[j];
        for (int64_t j = 0; j < s.dr; ++j) dot += qh[s.dn + j] * k_pe[size_t(u)][size_t(j)];
        scores.push_back(dot * s.yarn.score_gain() / std::sqrt(double(hd)));
      }
      double top = scores[0], sum = 0;
      for (double sc : scores) top = std::max(top, sc);
      for (double& sc : scores) sum += (sc = std::exp(sc - top));
      for (int64_t u = first; u <= n; ++u)
        for (int64_t j = 0; j < s.dv; ++j)
          ctx[size_t(h * s.dv + j)] +=
              scores[size_t(u - first)] / sum * kv[size_t(u)][size_t(h * (s.dn + s.dv) + s.dn + j)];
    }
    const Vec y = mat_vec(Wo, ctx, s.D);
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

// Rows `rows` of the [R, C] tensor t, in that order, as a new [rows.size(), C] tensor.
inline Tensor pick_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  const int64_t C = t.dim(1);
  const std::vector<float> all = t.to_vector();
  std::vector<float> out;
  for (int64_t r : rows) out.insert(out.end(), all.begin() + r * C, all.begin() + (r + 1) * C);
  return Tensor::from_vector({int64_t(rows.size()), C}, out);
}

// The rows of an interleaved RoPE part starting at `first`, in halves order: (first, first + 2,
// ..., first + 1, first + 3, ...).
inline void push_deinterleaved(std::vector<int64_t>& rows, int64_t first, int64_t dr) {
  for (int64_t i = 0; i < dr / 2; ++i) rows.push_back(first + 2 * i);
  for (int64_t i = 0; i < dr / 2; ++i) rows.push_back(first + 2 * i + 1);
}

// HF's tensors into our layer's params (prefix "attn"), refreshing their compute copies.
inline void load_mla(ParamSet& ps, const std::string& prefix, const MlaShape& s, const Weights& w) {
  auto set = [&](const std::string& ours, const Tensor& value) {
    Param& p = ps.at(prefix + "." + ours + ".weight");
    p.value.copy_from(value.reshape(p.value.shape()));
    p.refresh_compute();
  };
  const int64_t hd = s.qhd();
  std::vector<int64_t> q_rows, k_rope_rows, kv_a_rows, k_b_rows, v_b_rows;
  for (int64_t h = 0; h < s.H; ++h) {
    push_deinterleaved(q_rows, h * hd + s.dn, s.dr);
    for (int64_t j = 0; j < s.dn; ++j) q_rows.push_back(h * hd + j);
    for (int64_t j = 0; j < s.dn; ++j) k_b_rows.push_back(h * (s.dn + s.dv) + j);
    for (int64_t j = 0; j < s.dv; ++j) v_b_rows.push_back(h * (s.dn + s.dv) + s.dn + j);
  }
  push_deinterleaved(k_rope_rows, s.c, s.dr);
  for (int64_t j = 0; j < s.c; ++j) kv_a_rows.push_back(j);
  if (s.r > 0) {
    set("q_a", w.at("q_a_proj.weight"));
    set("q_a_norm", w.at("q_a_layernorm.weight"));
    set("q_b", pick_rows(w.at("q_b_proj.weight"), q_rows));
  } else {
    set("q", pick_rows(w.at("q_proj.weight"), q_rows));
  }
  const Tensor& kv_a = w.at("kv_a_proj_with_mqa.weight");
  set("kv_a", pick_rows(kv_a, kv_a_rows));
  set("k_rope", pick_rows(kv_a, k_rope_rows));
  set("kv_a_norm", w.at("kv_a_layernorm.weight"));
  set("k_b", pick_rows(w.at("kv_b_proj.weight"), k_b_rows));
  set("v_b", pick_rows(w.at("kv_b_proj.weight"), v_b_rows));
  set("o", w.at("o_proj.weight"));
}

inline nn::MlaConfig mla_config(const MlaShape& s) {
  return nn::MlaConfig{s.r, s.c, s.dn, s.dr, s.dv};
}

}  // namespace moe::test::dsv3
