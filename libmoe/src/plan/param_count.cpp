// The model's parameters counted as the Transformer creates them (moe/plan/memory_model.h's
// param_counts): one function per layer kind, each the shapes its constructor adds (nn/norm.cpp,
// nn/linear.cpp, nn/attention.cpp, nn/mla.cpp, nn/mlp.cpp, nn/experts.cpp, nn/router.cpp,
// nn/moe_layer.cpp, nn/block.cpp, models/transformer.cpp). tests/unit/test_plan_params.cpp
// checks the sums against Transformer::num_params() and the ParamSet's bytes for every family.
// Shape letters: V vocabulary, D model width, H heads, KV key/value heads, hd head dim, F expert
// hidden, E experts of a layer, r q_lora_rank, c kv_lora_rank.
#include <algorithm>

#include "moe/models/flavour.h"
#include "moe/plan/memory_model.h"

namespace moe::plan {

namespace {

double norm(const Flavour& f, double dim) {  // weight, and LayerNorm's bias
  return f.norm == nn::NormKind::layernorm ? 2 * dim : dim;
}

double linear(double in, double out, bool bias) { return in * out + (bias ? out : 0); }

// q, k, v, o (or latent attention's projections and norms), and the qk-norms.
double attention(const ModelConfig& c, const Flavour& f) {
  const double D = double(c.d_model), H = double(c.heads);
  const double hd = double(c.head_dim_resolved()), KV = double(c.kv_heads_resolved());
  double n = 0;
  if (c.mla()) {
    const double r = double(c.q_lora_rank), kv = double(c.kv_lora_rank);
    n += r > 0 ? D * r + r + r * H * hd : D * H * hd;    // q_a, q_a_norm, q_b; or one q
    n += D * kv + kv + D * double(c.qk_rope_dim);        // kv_a, kv_a_norm, k_rope
    n += kv * H * double(c.qk_nope_dim + c.v_head_dim);  // k_b, v_b
    n += linear(H * double(c.v_head_dim), D, f.bias);    // o
  } else {
    const bool qkv_bias = f.bias || f.qkv_bias;
    n += linear(D, H * hd, qkv_bias) + 2 * linear(D, KV * hd, qkv_bias);
    n += linear(H * hd, D, f.bias);
  }
  if (f.qk_norm == nn::QkNorm::head) n += 2 * hd;
  if (f.qk_norm == nn::QkNorm::full) n += (H + KV) * hd;
  if (f.sinks) n += H;  // a sink logit a head (f32)
  return n;
}

// A dense MLP of width F: w1, w2 (and a gated activation's w3), each with its bias where the
// flavour has them.
double mlp(const Flavour& f, double D, double F) {
  const bool w3 = moe::gated(f.activation);
  return linear(D, F, f.bias) + linear(F, D, f.bias) + (w3 ? linear(D, F, f.bias) : 0);
}

// One block's parameters that are not an expert's.
double block_dense(const ModelConfig& c, const Flavour& f, int64_t layer) {
  const double D = double(c.d_model);
  const int64_t E = c.experts_per_layer.at(size_t(layer));
  double n = 2 * norm(f, D) + attention(c, f);
  if (E == 0 || c.residual_moe)
    n += mlp(f, D, double(E == 0 && c.dense_ff > 0 ? c.dense_ff : c.d_ff));
  if (E > 0) {
    n += double(E) * D;                             // the router
    if (f.router_logit_bias) n += double(E);        // its logit bias (trained)
    if (c.router_selection_bias()) n += double(E);  // its selection bias (frozen, f32)
    if (c.router_center()) n += D;                  // its centre (frozen, f32)
    const double Fs = double(c.shared_expert_ff);
    if (Fs > 0) n += mlp(f, D, Fs) + (f.shared_expert_gate ? D : 0);
  }
  return n;
}

// The trained values a block keeps f32 in every dtype: the attention sinks.
double f32_trained_of_block(const ModelConfig& c, const Flavour& f) {
  return f.sinks ? double(c.heads) : 0;
}

double frozen_of_block(const ModelConfig& c, int64_t layer) {
  const int64_t E = c.experts_per_layer.at(size_t(layer));
  if (E == 0) return 0;
  return (c.router_selection_bias() ? double(E) : 0) + (c.router_center() ? double(c.d_model) : 0);
}

}  // namespace

double ParamCounts::value_bytes(DType dtype) const {
  const double f32 = frozen + f32_trained;
  return (total() - f32) * double(dtype_size(dtype)) + 4 * f32;
}

ParamCounts param_counts(const ModelConfig& c) { return param_counts(c, flavour_of(c)); }

ParamCounts param_counts(const ModelConfig& c, const Flavour& f) {
  const double V = double(c.vocab_size), D = double(c.d_model);
  ParamCounts p;
  p.dense = V * D + norm(f, D);                           // the token table, the final norm
  if (f.learned_positions) p.dense += double(c.seq) * D;  // GPT's position table
  if (!f.tied_head) p.dense += V * D;                     // the LM head
  const bool w3 = moe::gated(f.activation);
  const double F = double(c.d_ff);
  // w1, w2 (a gated activation's w3) and, with the flavour's biases, b1 [F], b2 [D] (and b3 [F])
  p.per_expert = (w3 ? 3 : 2) * D * F + (f.bias ? (w3 ? 2 : 1) * F + D : 0);
  for (int64_t l = 0; l < c.layers; ++l) {
    const double block = block_dense(c, f, l);
    p.dense += block;
    p.block_dense = std::max(p.block_dense, block);
    p.frozen += frozen_of_block(c, l);
    p.f32_trained += f32_trained_of_block(c, f);
    p.experts += c.experts_per_layer.at(size_t(l));
  }
  p.moe_layers = c.num_moe_layers();
  return p;
}

}  // namespace moe::plan
