// CUDA implementations of the MoE ops (moe/ops/moe.h), the distillation loss (moe/ops/distill.h)
// and the AdamW update (moe/ops/optim.h), put in the op table by backend/cuda/backend.cpp. Called
// through the table by the op after its operand checks, with every tensor on one CUDA device.
// Per-row / per-element math comes from libmoe/src/kernels.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/distill_loss.h"
#include "moe/op_types.h"
#include "moe/tensor.h"

namespace moe::cuda {

// ---- router (router.cu) ----
void router_jitter(const Tensor& x, float jitter, uint64_t key, Tensor& noise, Tensor& routed,
                   int64_t first_row);
void router_jitter_backward(const Tensor& noise, Tensor& dx);
void router_softmax(const Tensor& logits, Tensor& probs, Tensor& lse);
void router_topk(const Tensor& probs, int64_t k, bool normalize, const Tensor& bias, int64_t groups,
                 int64_t group_topk, Tensor& topk_idx, Tensor& topk_weight);
// aux_coef: the host-computed d aux / d probs[e] [E] (uploaded here); z_factor = 2 z_scale / N.
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

// ---- dispatch / combine (dispatch.cu) ----
void gather_rows(const Tensor& x, const Tensor& token_of_slot, Tensor& x_perm);
void combine_rows(const Tensor& rows, const Tensor& slot_of, const Tensor& weight_of_slot,
                  int64_t top_k, Tensor& y);
void combine_rows_backward(const Tensor& dy, const Tensor& y_perm, const Tensor& token_of_slot,
                           const Tensor& weight_of_slot, Tensor& dy_perm, Tensor& dweight_of_slot);
void slot_to_choice(const Tensor& dweight_of_slot, const Tensor& slot_of, Tensor& dtopk_weight);

// ---- grouped expert GEMM, bias and activation (grouped_gemm.cu) ----
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

// ---- distillation loss (distill_loss.cu) ----
// Per-row (ce, kd) in row order ({0, 0} where target < 0); dlogits (may be null) written with
// grad_scale * d total / d student, zero rows for ignored targets. Targets were checked by the op.
std::vector<kernels::DistillRow> distill_loss_rows(const Tensor& student, const Tensor& teacher,
                                                   const Tensor& targets, float temperature,
                                                   float ce_weight, float kd_weight,
                                                   Tensor* dlogits, float grad_scale);

// ---- optimizer (adamw.cu) ----
// adamw_update on every element of master/m/v (f32) with grad (f32), in place.
void adamw_update(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                  const kernels::AdamWScalars& scalars);
// x *= scale (f32), in place.
void scale_in_place(Tensor& x, float scale);

}  // namespace moe::cuda
