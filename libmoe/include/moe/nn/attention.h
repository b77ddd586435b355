// Causal multi-head self-attention: grouped-query heads, q/k/v and o biases, qk-norm, RoPE.
// Shape letters: B batch, T sequence, N = B*T tokens, D model width, H query heads, KV key/value
// heads (dividing H), hd head dim (D / H unless given: Qwen3-MoE has H*hd != D).
#pragma once
#include <memory>
#include <string>

#include "moe/nn/common.h"
#include "moe/nn/linear.h"
#include "moe/nn/mla.h"
#include "moe/nn/norm.h"
#include "moe/ops/dense.h"
#include "moe/param.h"

namespace moe::nn {

struct AttentionConfig {
  int64_t d_model = 0, heads = 0, kv_heads = 0;  // kv_heads 0 means kv_heads = heads
  int64_t head_dim = 0;                          // 0 means d_model / heads (which must divide)
  bool qkv_bias = false;                         // biases on q, k and v: gpt and qwen2_moe
  bool o_bias = false;                           // a bias on o: gpt (qwen2_moe has none)
  // RMSNorm of the projected queries and keys (after their biases, before RoPE), with eps
  // norm_eps: per head (weights [hd], shared by the heads) or over the whole projection
  // (weights [H*hd] and [KV*hd]).
  QkNorm qk_norm = QkNorm::none;
  float norm_eps = 1e-5f;
  // HF convention: rotate halves (pairs (i, i + hd/2)), inv_freq = theta^(-2i/hd),
  // position = index in the sequence.
  bool rope = false;
  float rope_theta = 10000.0f;
  ops::RopeScaling rope_scaling;  // YaRN's frequencies and attention factor; {} = plain RoPE
  // The softmax scale is score_scale / sqrt(hd): DeepSeek's YaRN sets it to mscale^2
  // (ModelConfig::attention_scale); the uncached path multiplies q by it after RoPE.
  float score_scale = 1.0f;
  // Partial rotary (GLM-4-MoE): only the first rope_dim features of each head rotate, as a head of
  // rope_dim would (inv_freq = theta^(-2i/rope_dim)); 0 = all hd.
  int64_t rope_dim = 0;
  // Multi-head Latent Attention (DeepSeek-V2/V3; nn/mla.h) when mla.enabled(): its projections
  // replace q/k/v (no biases, no qk-norm; kv_heads = heads, head_dim = qk_nope + qk_rope, the
  // RoPE on each head's first qk_rope features and on the shared k_pe), o reads H*v_head_dim.
  MlaConfig mla;
  // Sliding window: each query sees the last `window` positions, itself included
  // (ops::AttentionShape::window); 0 = all earlier positions. Not with latent attention.
  int64_t window = 0;
  // Attention sinks (gpt-oss): a learned logit a query head, param prefix.sinks [H] (f32, zeros
  // at the start, no decay; HF's self_attn.sinks), that joins each softmax row's maximum and
  // denominator and brings no value (ops::attention_forward). Not with latent attention.
  bool sinks = false;
  float init_std = 0.02f, out_init_std = 0.02f;
};

// Key/value cache of one attention layer for incremental decoding, fp32, S slots (one sequence
// each) of Tmax positions. Plain attention: k, v [S, Tmax, KV*hd], keys after RoPE. Latent
// attention (MLA) caches what its keys and values are made from, not them: latent
// [S, Tmax, kv_lora_rank + qk_rope], each position's normalised kv latent then its k_pe after
// RoPE (k and v undefined), and decodes through the absorbed projections (nn/mla.h); with a k_b /
// v_b the kernels read in 16 bits or quantised, key_weight / value_weight hold their f32 copies
// (Mla::key_weight_f32: per layer, not per token), made with the cache.
struct AttentionCache {
  Tensor k, v;
  Tensor latent;
  Tensor key_weight, value_weight;
  const Tensor& positions() const { return latent.defined() ? latent : k; }
  int64_t slots() const { return positions().defined() ? positions().dim(0) : 0; }
  int64_t capacity() const { return positions().defined() ? positions().dim(1) : 0; }
  // What one more cached position of one slot costs: (KV*hd) * 2 * 4 bytes, or
  // (kv_lora_rank + qk_rope) * 4 with the latent.
  int64_t bytes_per_token() const {
    if (latent.defined()) return latent.dim(2) * int64_t(dtype_size(latent.dtype()));
    return k.defined() ? (k.dim(2) + v.dim(2)) * int64_t(dtype_size(k.dtype())) : 0;
  }
};

// Params prefix.q.weight [H*hd, D], prefix.k.weight [KV*hd, D], prefix.v.weight [KV*hd, D],
// prefix.o.weight [D, H*hd] (+ prefix.{q,k,v}.bias [H*hd], [KV*hd], [KV*hd] when qkv_bias,
// prefix.o.bias [D] when o_bias); with qk-norm prefix.q_norm.weight and
// prefix.k_norm.weight ([hd] each per head; [H*hd] and [KV*hd] full width; ones, no decay);
// with sinks prefix.sinks [H] (f32 whatever the set's dtype, zeros, no decay).
// q = RoPE(qk_norm(x Wq^T + bq)), k likewise, v = x Wv^T + bv; scale 1/sqrt(hd). With latent
// attention (config.mla) the params are Mla's and prefix.o.weight [D, H*v_head_dim].
class Attention {
 public:
  Attention(ParamSet& ps, const std::string& prefix, const AttentionConfig& config);

  struct Saved {
    Tensor x;                    // [N, D] input
    Norm::Saved q_norm, k_norm;  // qk-norm: its input is the projection (after the bias)
    Mla::Saved mla;              // latent attention's projections
    Tensor q, k, v;              // [N, H*hd], [N, KV*hd] x2, after RoPE
    Tensor probs;                // [B, H, T, T] softmax of the causal scores
    Tensor ctx;                  // [N, H*hd] input of the output projection
    int64_t batch = 0, seq = 0;
  };
  // x [B*T, D] -> [B*T, D]; saved == nullptr for inference (then by query blocks, with no
  // [B,H,T,T] probabilities: ops::attention_forward_blocks).
  Tensor forward(const Tensor& x, int64_t batch, int64_t seq, Saved* saved) const;
  // Incremental forward (inference): x [N, D] holds the new tokens of `rows` (ops::CachedRows:
  // row r's count[r] tokens at positions start[r].. of cache slot slot[r]). Their keys/values
  // (after RoPE at those positions) are written into the cache, then each token attends to its
  // slot's positions 0..its own (the last `window` of them with a window; the cache still holds
  // every position). -> [N, D]. Equals forward() on the whole sequence at those
  // positions (bitwise for a row with start 0, up to BLAS row blocking; latent attention caches
  // the latent and decodes through the absorbed projections, nn/attention_latent.cpp: equal to
  // f32 reassociation).
  Tensor forward_cached(const Tensor& x, const ops::CachedRows& rows, AttentionCache& cache) const;
  // A zeroed cache of `slots` sequences of `capacity` positions.
  AttentionCache make_cache(int64_t slots, int64_t capacity) const;
  // Returns dx; accumulates the gradients of the four projections (and of the sinks).
  Tensor backward(const Tensor& dy, const Saved& saved);

  const AttentionConfig& config() const { return config_; }
  int64_t head_dim() const { return head_dim_; }

 private:
  // q or k [N, heads*hd] through its qk-norm (t itself without one), and the backward.
  Tensor qk_normed(const Norm* norm, const Tensor& t, int64_t heads, Norm::Saved* saved) const;
  Tensor qk_norm_backward(Norm* norm, const Tensor& dt, int64_t heads,
                          const Norm::Saved& saved) const;
  // q, k, v for the attention core, before RoPE (latent attention's v padded to heads of hd).
  void project(const Tensor& x, Tensor& q, Tensor& k, Tensor& v, Saved* saved) const;
  // The gradient of x from those of q, k, v (before RoPE); the projections' gradients accumulate.
  Tensor project_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Saved& saved);
  // Latent attention's cache and cached forward (nn/attention_latent.cpp).
  AttentionCache make_latent_cache(int64_t slots, int64_t capacity) const;
  Tensor forward_cached_latent(const Tensor& x, const ops::CachedRows& rows,
                               AttentionCache& cache) const;

  AttentionConfig config_;
  std::string name_;  // the params' prefix, for messages
  int64_t head_dim_;
  std::unique_ptr<Linear> q_, k_, v_;  // null with latent attention
  std::unique_ptr<Mla> mla_;           // null without
  std::unique_ptr<Linear> o_;
  std::unique_ptr<Norm> q_norm_, k_norm_;  // null without qk-norm
  Param* sinks_ = nullptr;                 // null without sinks
  // The sinks' f32 values for the attention op (undefined without).
  Tensor sinks() const { return sinks_ ? sinks_->w() : Tensor(); }
};

}  // namespace moe::nn
