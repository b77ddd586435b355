// Multi-head Latent Attention's projections (DeepSeek-V2/V3): the queries through an optional
// low-rank bottleneck, the keys and values through one shared latent of kv_lora_rank features a
// token, and a RoPE key of qk_rope features shared by every head. Attention (nn/attention.h) owns
// the RoPE, the attention core and the output projection; this class makes its q, k and v and
// takes their gradients back. Shape letters: N tokens, D model width, H heads, hd = qk_nope +
// qk_rope (the q/k head dim), vd the value head dim (at most hd).
#pragma once
#include <memory>
#include <string>

#include "moe/nn/linear.h"
#include "moe/nn/norm.h"
#include "moe/param.h"

namespace moe::nn {

struct MlaConfig {
  int64_t q_lora_rank = 0;   // 0: a plain q projection (DeepSeek-V2-Lite)
  int64_t kv_lora_rank = 0;  // 0: not MLA (the attention's ordinary q/k/v projections)
  int64_t qk_nope = 0, qk_rope = 0, v_head_dim = 0;
  bool enabled() const { return kv_lora_rank > 0; }
  int64_t head_dim() const { return qk_nope + qk_rope; }
};

// Params (prefix = the attention's): with q_lora_rank r prefix.q_a.weight [r, D],
// prefix.q_a_norm.weight [r], prefix.q_b.weight [H*hd, r]; else prefix.q.weight [H*hd, D];
// prefix.kv_a.weight [kv_lora_rank, D], prefix.k_rope.weight [qk_rope, D],
// prefix.kv_a_norm.weight [kv_lora_rank], prefix.k_b.weight [H*qk_nope, kv_lora_rank],
// prefix.v_b.weight [H*vd, kv_lora_rank]. Each head's q rows hold its RoPE features first, then
// the others (HF's q_b_proj holds them last, interleaved in pairs: import-hf reorders the rows;
// the scores are the same). Norms are RMSNorm with the model's eps.
class Mla {
 public:
  Mla(ParamSet& ps, const std::string& prefix, int64_t d_model, int64_t heads,
      const MlaConfig& config, float norm_eps, float init_std);

  struct Saved {
    Tensor x, cq, ckv;  // [N, D], q latent after its norm [N, r], kv latent before it
    Norm::Saved q_norm, kv_norm;
  };
  // Before RoPE: q [N, H*hd] (each head RoPE part first), k_pe [N, qk_rope], k_nope [N, H*qk_nope],
  // v [N, H*vd].
  struct Projected {
    Tensor q, k_pe, k_nope, v;
  };
  Projected project(const Tensor& x, Saved* saved) const;
  // k [N, H*hd]: each head [k_pe | its k_nope] (k_pe after RoPE).
  Tensor keys(const Tensor& k_pe, const Tensor& k_nope) const;
  // Values as the attention core wants them, heads of hd: [N, H*vd] -> [N, H*hd] zero-padded,
  // and back ([N, H*hd] -> [N, H*vd], the padding dropped). Each is the other's backward.
  Tensor pad_values(const Tensor& v) const;
  Tensor unpad_values(const Tensor& v) const;
  // dk [N, H*hd] -> dk_pe [N, qk_rope] (summed over the heads) and dk_nope [N, H*qk_nope].
  void keys_backward(const Tensor& dk, Tensor& dk_pe, Tensor& dk_nope) const;
  // Gradients of the projections from those of project()'s outputs; returns dx [N, D].
  Tensor backward(const Tensor& dq, const Tensor& dk_pe, const Tensor& dk_nope, const Tensor& dv,
                  const Saved& saved);

  // ---- Decode through the latent (DeepSeek-V2 paper, section 2.1: the absorbed projections).
  // A cached position holds c = kv_a_norm(x W_kv_a^T) [c features, c = kv_lora_rank] and its
  // k_pe after RoPE [qk_rope]: latent_width() floats instead of H (hd + vd). Head h's key is
  // [k_pe | c W_UK_h^T] and its value c W_UV_h^T (W_UK_h, W_UV_h: head h's rows of k_b and v_b),
  // so q_h . k_h = q_rope_h . k_pe + (q_nope_h W_UK_h) . c, and sum_j p_j v_j = (sum_j p_j c_j)
  // W_UV_h^T: the attention runs over the latent as one shared kv head of latent_width().
  int64_t latent_width() const { return config_.kv_lora_rank + config_.qk_rope; }
  // q [N, H*hd] and k_pe [N, qk_rope] before RoPE, c [N, kv_lora_rank] after its norm.
  struct Latent {
    Tensor q, c, k_pe;
  };
  Latent project_latent(const Tensor& x) const;
  // A cache row a token: [c | k_pe] -> [N, latent_width()].
  Tensor latent_rows(const Tensor& c, const Tensor& k_pe) const;
  // k_b's and v_b's weights [H*qk_nope, c] and [H*vd, c] in f32, their own layout, for a model
  // whose kernels read them in 16 bits or quantised (the absorbed products need W_UK_h itself,
  // not x W^T): widened exactly from 16 bits; a quantised one through the GEMM kernel's products
  // with the identity (its dequantised values where the kernel widens the rows, as it does for
  // a product of kv_lora_rank rows; test_mla_cache.cpp checks them). Undefined when the weight
  // is f32 already (read in place).
  Tensor key_weight_f32() const;
  Tensor value_weight_f32() const;
  // q [N, H*hd] after RoPE -> [N, H*latent_width()]: head h [q_nope_h W_UK_h | q_rope_h], times
  // `scale`. key_weight: key_weight_f32() (undefined: k_b's own f32 weight).
  Tensor absorb_queries(const Tensor& q, const Tensor& key_weight, float scale) const;
  // The attention's context over the latent [N, H*latent_width()] -> [N, H*vd]: head h
  // ctx_h[:c] W_UV_h^T (the k_pe part of the context is dropped). value_weight as above.
  Tensor absorb_values(const Tensor& ctx, const Tensor& value_weight) const;

  const MlaConfig& config() const { return config_; }
  int64_t heads() const { return heads_; }

 private:
  Tensor queries(const Tensor& x, Saved* saved) const;

  MlaConfig config_;
  int64_t heads_;
  std::unique_ptr<Linear> q_, q_a_, q_b_;  // q_ without a q latent, else q_a_ and q_b_
  std::unique_ptr<Norm> q_a_norm_;
  Linear kv_a_, k_rope_, k_b_, v_b_;
  Norm kv_a_norm_;
};

}  // namespace moe::nn
