// The op table of one device kind (ggml's ggml_backend_i is the model): every device-dependent
// piece of work the library does -- memory, the ops' loops, the optimizer update, asynchronous
// copies -- is a function pointer here, filled in by a backend (backend/cpu, backend/cuda) and
// looked up by device in backend/registry.cpp. Callers (core/tensor.cpp, ops/*.cpp,
// optim/adamw.cpp, offload/expert_ring.cpp, offload/device_copies.cpp) never name a backend: a
// third one is one more table.
//
// Entries run after the op's operand checks (ops/*.cpp), with every tensor on the table's device
// kind; their shapes and dtypes are already right. Index values that live on the device (ids,
// targets) are checked by the op on a host copy, which it passes on where a backend needs it.
// Shape letters as in moe/ops/*.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/distill_loss.h"
#include "moe/device.h"
#include "moe/op_types.h"
#include "moe/rope_scaling.h"
#include "moe/tensor.h"

namespace moe {

struct Backend {
  const char* name;

  // Tensor storage: allocation, byte copies, dtype conversion, fill and zero.
  struct Memory {
    // `bytes` (>= 1) of storage on device `index` of this kind.
    std::shared_ptr<std::byte> (*allocate)(size_t bytes, int index);
    // Equal byte sizes; one side may be on the host (the table is the other side's).
    void (*copy)(Tensor& dst, const Tensor& src);
    // dst = src converted between floating dtypes (same element count).
    void (*convert)(const Tensor& src, Tensor& dst);
    void (*fill)(Tensor& t, float value);
    void (*zero)(Tensor& t);
  } memory;

  // moe/ops/core.h
  struct Core {
    void (*gemm)(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
                 float alpha, float beta);
    void (*axpy)(float alpha, const Tensor& x, Tensor& y);
    void (*scale)(Tensor& x, float alpha);
    void (*round_to_dtype)(Tensor& x, DType dtype);  // dtype is bf16 or f16 or not floating
    double (*sum_squares)(const Tensor& x);
  } core;

  // moe/ops/dense.h
  struct Dense {
    void (*embedding_forward)(const Tensor& table, const Tensor& ids, Tensor& out);
    // host_ids: `ids` on the host (the backward groups tokens by id there).
    void (*embedding_backward)(const Tensor& dy, const Tensor& ids, const Tensor& host_ids,
                               Tensor& table_grad);
    void (*layernorm_forward)(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                              Tensor& y, Tensor* mean, Tensor* rstd);
    void (*layernorm_backward)(const Tensor& dy, const Tensor& x, const Tensor& weight,
                               const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                               Tensor* dbias);
    void (*rmsnorm_forward)(const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                            Tensor* rstd);
    void (*rmsnorm_backward)(const Tensor& dy, const Tensor& x, const Tensor& weight,
                             const Tensor& rstd, Tensor& dx, Tensor& dweight);
    void (*bias_add)(Tensor& y, const Tensor& bias);
    void (*bias_grad)(const Tensor& dy, Tensor& dbias);
    void (*gelu_forward)(const Tensor& x, Tensor& y);
    void (*gelu_backward)(const Tensor& dy, const Tensor& x, Tensor& dx);
    void (*swiglu_forward)(const Tensor& gate, const Tensor& up, Tensor& y);
    void (*swiglu_backward)(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate,
                            Tensor& dup);
    // inverse = false: the forward rotation; true: its transpose (the backward). rotary_dim: the
    // features of each head rotated (the first ones; the rest pass through); scaling: YaRN's
    // frequencies and attention factor (default: plain RoPE).
    void (*rope_apply)(const Tensor& x, int64_t batch, int64_t seq, int64_t heads,
                       int64_t rotary_dim, float theta, const ops::RopeScaling& scaling, Tensor& y,
                       int64_t position_offset, bool inverse);
    // sinks [H] (undefined: none): each query head's sink logit in its softmax rows; the
    // backward adds their gradient into *dsinks (null: not wanted).
    void (*attention_forward)(const Tensor& q, const Tensor& k, const Tensor& v,
                              const ops::AttentionShape& shape, const Tensor& sinks, Tensor& probs,
                              Tensor& ctx);
    void (*attention_backward)(const Tensor& dctx, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& probs,
                               const ops::AttentionShape& shape, const Tensor& sinks, Tensor& dq,
                               Tensor& dk, Tensor& dv, Tensor* dsinks);
    void (*attention_forward_cached)(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                     int64_t heads, int64_t kv_heads, const ops::CachedRows& rows,
                                     const Tensor& sinks, Tensor& ctx);
    // nll [N] = each row's nll (0 for a negative target), dlogits (may be null) its gradient
    // times grad_scale; targets already checked by the op.
    void (*cross_entropy_rows)(const Tensor& logits, const Tensor& targets, float grad_scale,
                               Tensor* dlogits, Tensor& nll);
  } dense;

  // moe/ops/moe.h (router_load, the losses and build_routing run on the host in the op itself)
  struct MoE {
    void (*router_jitter)(const Tensor& x, float jitter, uint64_t key, Tensor& noise,
                          Tensor& routed, int64_t first_row);
    void (*router_jitter_backward)(const Tensor& noise, Tensor& dx);
    void (*router_softmax)(const Tensor& logits, Tensor& probs, Tensor& lse);
    // bias: [E] selection bias added to probs for the choice only (undefined: none); groups > 1:
    // group-limited choice (kernels::topk_groups_row).
    void (*router_topk)(const Tensor& probs, int64_t k, bool normalize, const Tensor& bias,
                        int64_t groups, int64_t group_topk, Tensor& topk_idx, Tensor& topk_weight);
    // aux_coef: the host-computed d aux / d probs[e] [E]; z_factor = 2 z_scale / N.
    void (*router_backward)(const Tensor& probs, const Tensor& lse, const Tensor& topk_idx,
                            const Tensor& dtopk_weight, bool normalize,
                            const std::vector<float>& aux_coef, float z_factor, Tensor& dlogits);
    void (*router_sigmoid)(const Tensor& logits, Tensor& scores, Tensor& probs, Tensor& lse);
    void (*router_backward_sigmoid)(const Tensor& scores, const Tensor& logits, const Tensor& lse,
                                    const Tensor& topk_idx, const Tensor& dtopk_weight,
                                    bool normalize, const std::vector<float>& aux_coef,
                                    float z_factor, Tensor& dlogits);
    // A centred router's weight W' [E,D] from W [E,D] and its center [D] (out may alias w).
    void (*router_center_weight)(const Tensor& w, const Tensor& center, Tensor& out);
    // The shared expert's gate: y = sigmoid(x); dx = dy * y * (1 - y) (dx may alias dy).
    void (*sigmoid)(const Tensor& x, Tensor& y);
    void (*sigmoid_backward)(const Tensor& dy, const Tensor& y, Tensor& dx);
    void (*gather_rows)(const Tensor& x, const Tensor& token_of_slot, Tensor& x_perm);
    void (*combine_rows)(const Tensor& rows, const Tensor& slot_of, const Tensor& weight_of_slot,
                         int64_t top_k, Tensor& y);
    void (*combine_rows_backward)(const Tensor& dy, const Tensor& y_perm,
                                  const Tensor& token_of_slot, const Tensor& weight_of_slot,
                                  Tensor& dy_perm, Tensor& dweight_of_slot);
    void (*slot_to_choice)(const Tensor& dweight_of_slot, const Tensor& slot_of,
                           Tensor& dtopk_weight);
    void (*grouped_gemm)(const Tensor& a, const Tensor& w, bool transpose_w,
                         const std::vector<int32_t>& offsets, Tensor& c, float beta);
    void (*grouped_gemm_weight_grad)(const Tensor& dy, const Tensor& x,
                                     const std::vector<int32_t>& offsets, Tensor& dw);
    void (*expert_activation)(Tensor& h, const Tensor& h3, const Tensor& bias,
                              const std::vector<int32_t>& offsets, Activation activation,
                              SwigluClamp clamp, Tensor& a);
    void (*expert_activation_backward)(const Tensor& da, const Tensor& h, const Tensor& h3,
                                       Activation activation, SwigluClamp clamp, Tensor& dh,
                                       Tensor& dh3);
    void (*grouped_add_bias)(Tensor& y, const Tensor& bias, const std::vector<int32_t>& offsets);
    void (*grouped_bias_grad)(const Tensor& dy, const std::vector<int32_t>& offsets, Tensor& dbias);
  } moe;

  // moe/ops/distill.h: per-row (ce, kd) in row order ({0, 0} where target < 0); dlogits (may be
  // null) written with grad_scale * d total / d student, zero rows for ignored targets.
  struct Distill {
    std::vector<kernels::DistillRow> (*loss_rows)(const Tensor& student, const Tensor& teacher,
                                                  const Tensor& targets, float temperature,
                                                  float ce_weight, float kd_weight, Tensor* dlogits,
                                                  float grad_scale);
  } distill;

  // moe/ops/optim.h: kernels::adamw_update on every element of master/m/v with grad, in place.
  struct Optim {
    void (*adamw_update)(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                         const kernels::AdamWScalars& scalars);
    // The same update, then value (bf16/f16, same shape) = master rounded to its dtype and, when
    // compute is not null, compute (f32) = value upcast: one pass. Null: ops::adamw_update_rounded
    // runs the update, Tensor::copy_from and the upcast as three passes.
    void (*adamw_update_rounded)(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                                 const kernels::AdamWScalars& scalars, Tensor& value,
                                 Tensor* compute);
  } optim;

  // Copies between host and device that overlap compute (the expert ring's loads, the tiered
  // store's uploads and gradient downloads), for devices with their own queues. Streams and events
  // are opaque handles owned by the shared_ptrs create_* return; a null stream means the queue ops
  // on `device` run on now (its compute stream). Every call makes `device` current on the calling
  // thread first. Null entries on the CPU table: host memory needs no staging.
  struct CopyEngine {
    // Page-locked host memory, for staging buffers a copy reads while the host fills another.
    std::shared_ptr<std::byte> (*allocate_pinned)(size_t bytes);
    std::shared_ptr<void> (*create_stream)(int device);
    std::shared_ptr<void> (*create_event)(int device);
    // Records the work queued so far on `stream` into `event`.
    void (*record)(void* event, void* stream, int device);
    // Makes `stream` wait (on the device) for the work recorded in `event`.
    void (*wait)(void* event, void* stream, int device);
    // The host waits for the event's work / for everything queued on the stream.
    void (*synchronize_event)(void* event);
    void (*synchronize_stream)(void* stream);
    // Queues a copy of `bytes` from host `src` to device memory `dst` on `stream`.
    void (*copy_to_device_async)(void* dst, const void* src, size_t bytes, void* stream,
                                 int device);
    // Queues a copy of `bytes` from device memory `src` to host `dst` (pinned, so that the copy
    // is asynchronous) on `stream`; `dst` may be read once an event recorded after it completed.
    void (*copy_to_host_async)(void* dst, const void* src, size_t bytes, void* stream, int device);
  } copy_engine;
};

// The table of `device`'s kind (backend/registry.cpp). Throws moe::Error "no backend for <device>:
// <why>" when this build or machine has none.
const Backend& backend_for(Device device);
// The table of a kind this build has, or null (without checking for a usable device).
const Backend* find_backend(Device::Kind kind);

}  // namespace moe
