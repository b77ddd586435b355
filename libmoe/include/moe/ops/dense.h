// Ops of the dense transformer layers: embedding lookup, LayerNorm / RMSNorm, bias and
// activations, RoPE, causal attention, cross-entropy. fp32 compute; each op checks its operands
// (shape, dtype, device) and writes into tensors the caller allocated. Ops that produce parameter
// gradients accumulate (+=) into them, in an order that does not depend on the thread count.
// Shape letters: N tokens (B*T), B batch, T sequence, D features, H query heads, KV key/value
// heads, hd head dim, C columns, V vocabulary.
#pragma once
#include <vector>

#include "moe/op_types.h"
#include "moe/rope_scaling.h"
#include "moe/tensor.h"

namespace moe::ops {

// ---- embedding (ops/embedding.cpp)
// out[N,dim] = table[ids[n]]; ids i32 of any shape with N elements. An id outside [0, rows)
// throws naming the id, its position and the table.
void embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out);
// table_grad[ids[n]] += dy[n], rows summed in token order (deterministic, no atomics).
void embedding_backward(const Tensor& dy, const Tensor& ids, Tensor& table_grad);

// ---- norms (ops/norm.cpp); x, y [N,D], weight/bias [D], mean/rstd [N] (may be null)
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       Tensor& y, Tensor* mean, Tensor* rstd);
// dx written; dweight (and dbias when not null) accumulated.
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor* dbias);
void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor* rstd);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      Tensor& dx, Tensor& dweight);

// ---- bias and activations (ops/activation.cpp)
// y[N,C] += bias[C]
void bias_add(Tensor& y, const Tensor& bias);
// dbias[C] += sum over rows of dy[N,C] (rows in order, parallel over columns)
void bias_grad(const Tensor& dy, Tensor& dbias);
// y = gelu_tanh(x); dx = dy * gelu_tanh'(x). Same shapes; y/dx may alias x/dy.
void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);
// y = silu(gate) * up; dgate = dy * up * silu'(gate), dup = dy * silu(gate). Same shapes.
void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y);
void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup);

// ---- rotary position embedding (ops/rope.cpp)
// x, y [B*T, heads*hd]; token (b, t) sits at position position_offset + t. y may alias x.
// rotary_dim: the first features of each head that rotate (even, <= hd; 0 = all hd): partial
// rotary (GLM-4-MoE) rotates rd of them as a head of rd would be, the rest pass through.
// scaling: YaRN's frequencies and attention factor (moe/rope_scaling.h; the default is plain).
void rope_forward(const Tensor& x, int64_t batch, int64_t seq, int64_t heads, float theta,
                  Tensor& y, int64_t position_offset = 0, int64_t rotary_dim = 0,
                  const RopeScaling& scaling = {});
// dx = R^T dy (the inverse rotation; with an attention factor a, (a R)^T dy). dx may alias dy.
void rope_backward(const Tensor& dy, int64_t batch, int64_t seq, int64_t heads, float theta,
                   Tensor& dx, int64_t position_offset = 0, int64_t rotary_dim = 0,
                   const RopeScaling& scaling = {});

// YaRN's RopeScaling for a head's rotary_dim features, as transformers' _compute_yarn_parameters
// derives it (rope_type "yarn"): the correction range of beta_fast and beta_slow rotations over
// original_ctx positions (floored and ceiled unless truncate is false, as gpt-oss sets), and the
// attention factor: `attention_factor` when > 0, else 0.1 ln(factor) + 1, or with mscale and
// mscale_all_dim both > 0 the ratio of those two terms (DeepSeek). UsageError on values that
// give no ramp (factor < 1, original_ctx < 1, betas <= 0, rotary_dim < 2).
RopeScaling yarn_scaling(const YarnSettings& yarn, double theta, int64_t rotary_dim);
// YaRN's mscale (the paper's eq. 21, transformers' yarn_get_mscale): 0.1 m ln(s) + 1, 1 at s <= 1.
double yarn_mscale(double scale, double m = 1.0);

// ---- causal self-attention core (ops/attention.cpp; AttentionShape in moe/op_types.h)
// q [B*T, H*hd], k/v [B*T, KV*hd] (query head h reads kv head h / (H/KV)),
// probs [B,H,T,T] (softmax of scaled causal scores; zero above the diagonal), ctx [B*T, H*hd].
// Scale 1/sqrt(hd).
// Attention sinks (gpt-oss): sinks [H] f32, undefined for none. Head h's logit sinks[h] (not
// scaled) joins each of its softmax rows' maximum and denominator and brings no value:
// p_ij = exp(s_ij - m) / (exp(sinks[h] - m) + sum_j' exp(s_ij' - m)), m = max(sinks[h], max s_ij),
// so a row of probs sums to less than 1 (kernels::causal_softmax_sink_row). A sink far below the
// scores (exp underflowing) gives the plain attention's bits.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionShape& shape, Tensor& probs, Tensor& ctx,
                       const Tensor& sinks = Tensor());
// The same context without the probabilities (inference: no backward to save them for), query
// rows `block_rows` at a time, each block seeing only its visible keys (attention_forward_cached
// on the window's own keys): memory beyond q, k, v and ctx is a block's scores a thread, not
// [B,H,T,T]. A window of T <= block_rows gives attention_forward's bits (a row with start 0, as
// below); a window cut into blocks sums each query's keys in the blocks' own products, within
// float rounding of attention_forward.
void attention_forward_blocks(const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttentionShape& shape, int64_t block_rows, Tensor& ctx,
                              const Tensor& sinks = Tensor());
// dq, dk, dv written (same shapes as q, k, v). Gradients of one kv head are summed over its
// query heads in head order, so the result does not depend on the thread count. With sinks (the
// forward's), dsinks [H] f32 (when not null) accumulates d loss / d sinks: -sum over head h's rows
// of p_sink * sum_j p_ij (dctx_i . v_j), p_sink = 1 - sum_j p_ij (derived at
// kernels::sink_gradient_row), added in double in a fixed order.
void attention_backward(const Tensor& dctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& probs, const AttentionShape& shape, Tensor& dq, Tensor& dk,
                        Tensor& dv, const Tensor& sinks = Tensor(), Tensor* dsinks = nullptr);

// Incremental (cached) attention, for generation: see CachedRows (moe/op_types.h).
// q, ctx [N, H*hd]; k_cache, v_cache [S, Tmax, KV*hd] (S slots of Tmax positions) already holding
// each row's keys/values at positions 0 .. start[r] + count[r] - 1 (the new ones included).
// Query i of row r sees keys 0 .. start[r] + i. Every (row, head) runs the products of
// attention_forward on one sequence (BLAS from serial loops), so a row's result does not depend
// on the other rows, and a row with start 0 gives bitwise what attention_forward gives for it
// alone. Scale 1/sqrt(hd). sinks [H] as attention_forward's.
void attention_forward_cached(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              int64_t heads, int64_t kv_heads, const CachedRows& rows, Tensor& ctx,
                              const Tensor& sinks = Tensor());

// ---- cross-entropy (ops/cross_entropy.cpp)
// Mean over rows with target >= 0 of -log softmax(logits)[target]; logits [N,V] f32, targets [N]
// i32 (negative = ignored). dlogits [N,V] (when not null) is written with
// scale * d(mean)/d(logits), zero on ignored rows; row_nll [N] (when not null) with each row's
// nll (0 when ignored). The mean is accumulated in double in row order. 0 when no row counts.
double cross_entropy(const Tensor& logits, const Tensor& targets, float scale, Tensor* dlogits,
                     Tensor* row_nll);

}  // namespace moe::ops
