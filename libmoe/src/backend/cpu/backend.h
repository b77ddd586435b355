// The CPU backend: its op table and the functions the table points to (one file per op group, the
// loops only; the operand checks are the ops' own, in ops/*.cpp). Internal to libmoe.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend.h"

namespace moe::cpu {

// The CPU's op table (backend/cpu/backend.cpp).
const Backend& table();

// ---- memory (memory.cpp): host storage, from the current ArenaScope's arena when one is active
std::shared_ptr<std::byte> allocate(size_t bytes, int index);
void copy(Tensor& dst, const Tensor& src);
void convert(const Tensor& src, Tensor& dst);
void fill(Tensor& t, float value);
void zero(Tensor& t);

// ---- core ops (core_ops.cpp)
void gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
          float alpha, float beta);
void axpy(float alpha, const Tensor& x, Tensor& y);
void scale(Tensor& x, float alpha);
void round_to_dtype(Tensor& x, DType dtype);
double sum_squares(const Tensor& x);

// ---- dense ops (embedding.cpp, norm.cpp, activation.cpp, rope.cpp, attention.cpp,
// cross_entropy.cpp)
void embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out);
void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& host_ids,
                        Tensor& table_grad);
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       Tensor& y, Tensor* mean, Tensor* rstd);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor* dbias);
void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor* rstd);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      Tensor& dx, Tensor& dweight);
void bias_add(Tensor& y, const Tensor& bias);
void bias_grad(const Tensor& dy, Tensor& dbias);
void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);
void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y);
void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup);
void rope_apply(const Tensor& x, int64_t batch, int64_t seq, int64_t heads, int64_t rotary_dim,
                float theta, const ops::RopeScaling& scaling, Tensor& y, int64_t position_offset,
                bool inverse);
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                       const ops::AttentionShape& shape, const Tensor& sinks, Tensor& probs,
                       Tensor& ctx);
void attention_backward(const Tensor& dctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& probs, const ops::AttentionShape& shape, const Tensor& sinks,
                        Tensor& dq, Tensor& dk, Tensor& dv, Tensor* dsinks);
void attention_forward_cached(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              int64_t heads, int64_t kv_heads, const ops::CachedRows& rows,
                              const Tensor& sinks, Tensor& ctx);
// One head of one decode query (attention.cpp): scores against keys 0..start, the causal
// softmax, the context. wide: the AVX-512 loops (same bits; only where avx512_available()).
// sink: the head's sink logit (kernels::causal_softmax_sink_row; -inf = none).
void decode_head(const float* q, const float* k, const float* v, int64_t ldk, int64_t start,
                 int64_t hd, float scale, float* ps, float* ctx, bool wide,
                 float sink = -INFINITY);
void cross_entropy_rows(const Tensor& logits, const Tensor& targets, float grad_scale,
                        Tensor* dlogits, Tensor& nll);

// ---- MoE ops (router_ops.cpp, dispatch_ops.cpp, grouped_gemm.cpp)
void router_jitter(const Tensor& x, float jitter, uint64_t key, Tensor& noise, Tensor& routed,
                   int64_t first_row);
void router_jitter_backward(const Tensor& noise, Tensor& dx);
void router_softmax(const Tensor& logits, Tensor& probs, Tensor& lse);
void router_topk(const Tensor& probs, int64_t k, bool normalize, const Tensor& bias, int64_t groups,
                 int64_t group_topk, Tensor& topk_idx, Tensor& topk_weight);
void router_backward(const Tensor& probs, const Tensor& lse, const Tensor& topk_idx,
                     const Tensor& dtopk_weight, bool normalize, const std::vector<float>& aux_coef,
                     float z_factor, Tensor& dlogits);
void router_sigmoid(const Tensor& logits, Tensor& scores, Tensor& probs, Tensor& lse);
void router_backward_sigmoid(const Tensor& scores, const Tensor& logits, const Tensor& lse,
                             const Tensor& topk_idx, const Tensor& dtopk_weight, bool normalize,
                             const std::vector<float>& aux_coef, float z_factor, Tensor& dlogits);
void router_center_weight(const Tensor& w, const Tensor& center, Tensor& out);
void sigmoid(const Tensor& x, Tensor& y);
void sigmoid_backward(const Tensor& dy, const Tensor& y, Tensor& dx);
void gather_rows(const Tensor& x, const Tensor& token_of_slot, Tensor& x_perm);
void combine_rows(const Tensor& rows, const Tensor& slot_of, const Tensor& weight_of_slot,
                  int64_t top_k, Tensor& y);
void combine_rows_backward(const Tensor& dy, const Tensor& y_perm, const Tensor& token_of_slot,
                           const Tensor& weight_of_slot, Tensor& dy_perm, Tensor& dweight_of_slot);
void slot_to_choice(const Tensor& dweight_of_slot, const Tensor& slot_of, Tensor& dtopk_weight);
void grouped_gemm(const Tensor& a, const Tensor& w, bool transpose_w,
                  const std::vector<int32_t>& offsets, Tensor& c, float beta);
void grouped_gemm_weight_grad(const Tensor& dy, const Tensor& x,
                              const std::vector<int32_t>& offsets, Tensor& dw);
void expert_activation(Tensor& h, const Tensor& h3, const Tensor& bias,
                       const std::vector<int32_t>& offsets, Activation activation,
                       SwigluClamp clamp, Tensor& a);
void expert_activation_backward(const Tensor& da, const Tensor& h, const Tensor& h3,
                                Activation activation, SwigluClamp clamp, Tensor& dh, Tensor& dh3);
void grouped_add_bias(Tensor& y, const Tensor& bias, const std::vector<int32_t>& offsets);
void grouped_bias_grad(const Tensor& dy, const std::vector<int32_t>& offsets, Tensor& dbias);

// ---- distillation loss (distill_loss.cpp) and optimizer (adamw.cpp)
std::vector<kernels::DistillRow> distill_loss_rows(const Tensor& student, const Tensor& teacher,
                                                   const Tensor& targets, float temperature,
                                                   float ce_weight, float kd_weight,
                                                   Tensor* dlogits, float grad_scale);
void adamw_update(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                  const kernels::AdamWScalars& scalars);
void adamw_update_rounded(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                          const kernels::AdamWScalars& scalars, Tensor& value, Tensor* compute);

}  // namespace moe::cpu
