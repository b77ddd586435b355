// Causal multi-head self-attention with grouped-query heads and optional RoPE.
// Shape letters: B batch, T sequence, N = B*T tokens, D model width, H query heads, KV key/value
// heads (dividing H), hd = D / H head dim.
#pragma once
#include <string>

#include "moe/nn/linear.h"
#include "moe/param.h"

namespace moe::nn {

struct AttentionConfig {
  int64_t d_model = 0, heads = 0, kv_heads = 0;  // kv_heads 0 means kv_heads = heads
  bool bias = false;                             // gpt: true, mixtral: false
  // HF convention: rotate halves (pairs (i, i + hd/2)), inv_freq = theta^(-2i/hd),
  // position = index in the sequence.
  bool rope = false;
  float rope_theta = 10000.0f;
  float init_std = 0.02f, out_init_std = 0.02f;
};

// Params prefix.q.weight [H*hd, D], prefix.k.weight [KV*hd, D], prefix.v.weight [KV*hd, D],
// prefix.o.weight [D, H*hd] (+ ".bias" of each when bias). Scale 1/sqrt(hd).
class Attention {
 public:
  Attention(ParamSet& ps, const std::string& prefix, const AttentionConfig& config);

  struct Saved {
    Tensor x;        // [N, D] input
    Tensor q, k, v;  // [N, H*hd], [N, KV*hd] x2, after RoPE
    Tensor probs;    // [B, H, T, T] softmax of the causal scores
    Tensor ctx;      // [N, H*hd] input of the output projection
    int64_t batch = 0, seq = 0;
  };
  // x [B*T, D] -> [B*T, D]; saved == nullptr for inference.
  Tensor forward(const Tensor& x, int64_t batch, int64_t seq, Saved* saved) const;
  // Returns dx; accumulates the gradients of the four projections.
  Tensor backward(const Tensor& dy, const Saved& saved);

  const AttentionConfig& config() const { return config_; }
  int64_t head_dim() const { return head_dim_; }

 private:
  AttentionConfig config_;
  int64_t head_dim_;
  Linear q_, k_, v_, o_;
};

}  // namespace moe::nn
