// CUDA implementations of the dense-layer ops (moe/ops/dense.h), the CUDA backend's internal
// header: backend/cuda/backend.cpp puts them in the op table. Called through the table by the op
// after its checks (those of index values on a host copy), with every tensor on one CUDA device.
#pragma once
#include <cstdint>

#include "moe/op_types.h"
#include "moe/rope_scaling.h"
#include "moe/tensor.h"

namespace moe::cuda {

// ids checked by the caller; host_ids: the same ids on the host (the backward groups tokens by id
// there).
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

// inverse = false: forward rotation; true: its transpose (the backward).
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

// nll [N] = each row's nll (0 for a negative target), dlogits (may be null) its gradient times
// grad_scale; targets already checked by the caller.
void cross_entropy_rows(const Tensor& logits, const Tensor& targets, float grad_scale,
                        Tensor* dlogits, Tensor& nll);

}  // namespace moe::cuda
