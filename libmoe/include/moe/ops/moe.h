// Ops of the MoE layer (router, dispatch/combine, grouped expert GEMM). Each op checks its
// operands (shape, dtype, device) and dispatches on the device of its tensors; all compute fp32.
// Shapes: N tokens, D model width, F expert hidden width, E experts, k experts per token,
// M kept assignments = rows of the permuted (expert-ordered) buffer.
// Expert segments are given by offsets [E+1]: rows offsets[e] .. offsets[e+1] belong to expert e.
#pragma once
#include <cstdint>
#include <vector>

#include "moe/op_types.h"
#include "moe/tensor.h"

namespace moe::ops {

// ---- router (ops/router.cpp) ----

// noise [N,D] = U(1 - jitter, 1 + jitter) (Philox keyed by `key`, indexed by element),
// routed [N,D] = x * noise.
// Noise element (t, d) is jitter_factor(key, (first_row + t) * D + d): first_row places x's rows in
// a larger batch (data parallelism), so a token gets the same noise wherever it is computed.
void router_jitter(const Tensor& x, float jitter, uint64_t key, Tensor& noise, Tensor& routed,
                   int64_t first_row = 0);
// dx *= noise (the backward of the jitter multiply), in place.
void router_jitter_backward(const Tensor& noise, Tensor& dx);
// probs [N,E] = softmax(logits) per row, lse [N] = logsumexp per row (fp32).
void router_softmax(const Tensor& logits, Tensor& probs, Tensor& lse);
// topk_idx [N,k] i32 (descending probability, ties to the lower index), topk_weight [N,k] f32
// (the probabilities, renormalised to sum 1 per row when `normalize`). With a selection bias
// [E] f32 (DeepSeek-V3), the choice is by probs + bias and the weights stay the probabilities.
// groups > 1 (DeepSeek-V3, GLM-4-MoE n_group / topk_group): the E experts form `groups` equal
// groups in order, each scored by the sum of its two largest probs + bias; only the experts of the
// group_topk best groups are chosen (the others' keys count 0, as transformers masks them).
inline constexpr int64_t kMaxRouterGroups = 64;
void router_topk(const Tensor& probs, int64_t k, bool normalize, Tensor& topk_idx,
                 Tensor& topk_weight, const Tensor& bias = Tensor(), int64_t groups = 1,
                 int64_t group_topk = 1);
// Sigmoid scoring (DeepSeek-V3): scores [N,E] = sigmoid(logits), probs [N,E] = scores / their row
// sum (the aux loss's P_e averages these), lse [N] = logsumexp of each logits row (z-loss).
void router_sigmoid(const Tensor& logits, Tensor& scores, Tensor& probs, Tensor& lse);
// Assignments per expert [E] over all N*k choices (before capacity).
std::vector<int64_t> router_load(const Tensor& topk_idx, int64_t num_experts);
// E * sum_e f_e P_e, f_e = load_e / (load_tokens k), P_e = mean over the N rows of probs[t,e];
// fixed-order fp64 sums. load_tokens: the tokens `load` counts (N, or a global batch).
double router_aux_loss(const Tensor& probs, const std::vector<int64_t>& load, int64_t load_tokens,
                       int64_t top_k);
// mean_t lse_t^2 (fp64, fixed order).
double router_z_loss(const Tensor& lse);
// dlogits [N,E] from d loss / d topk_weight [N,k], the aux loss (scale aux_scale, f constant) and
// the z loss (scale z_scale). `normalize` as in router_topk.
void router_backward(const Tensor& probs, const Tensor& lse, const Tensor& topk_idx,
                     const Tensor& dtopk_weight, bool normalize, const std::vector<int64_t>& load,
                     int64_t load_tokens, float aux_scale, float z_scale, Tensor& dlogits);
// router_backward under sigmoid scoring: the gate weights came from `scores` (router_topk on
// them), the aux loss from their normalisation (router_sigmoid's probs), the z loss from lse.
void router_backward_sigmoid(const Tensor& scores, const Tensor& logits, const Tensor& lse,
                             const Tensor& topk_idx, const Tensor& dtopk_weight, bool normalize,
                             const std::vector<int64_t>& load, int64_t load_tokens, float aux_scale,
                             float z_scale, Tensor& dlogits);
// A centred router's weight (nn::RouterConfig::center): out = W' = W - C (W c) c^T / |c|^2, C the
// centring over experts, sums in double in index order (kernels/router.h); out = W exactly when
// c = 0. w, out [E,D] f32 (out may alias w), center [D] f32, one device: a GPU computes it there,
// with no host round trip.
void router_center_weight(const Tensor& w, const Tensor& center, Tensor& out);
// y = sigmoid(x), dx = dy * y * (1 - y) (from the output): the shared expert's gate. Same shapes;
// y / dx may alias x / dy.
void sigmoid(const Tensor& x, Tensor& y);
void sigmoid_backward(const Tensor& dy, const Tensor& y, Tensor& dx);

// ---- dispatch / combine (ops/dispatch.cpp) ----

// The dispatch plan of one MoE layer: a dense token -> slot mapping into the permuted
// (expert-ordered) buffer, no one-hot, no padding. A value: build_routing returns it, the MoE layer
// (nn::make_plan, whose nn::DispatchPlan is this type) keeps it for backward.
struct DispatchPlan {
  int64_t num_tokens = 0, top_k = 0, num_experts = 0;
  int64_t capacity = 0;                    // per-expert slots; 0 = dropless
  std::vector<int32_t> tokens_per_expert;  // [E] kept assignments per expert
  std::vector<int32_t> expert_offsets;     // [E+1] into the permuted buffer
  std::vector<int64_t> load;               // [E] assignments per expert before capacity
  Tensor slot_of;         // [N*k] i32: slot of token t's j-th choice (t*k + j), -1 = dropped
  Tensor token_of_slot;   // [M] i32
  Tensor weight_of_slot;  // [M] f32 gate weight used by combine
  // [R] rows this rank sends to / receives from each rank of the expert-parallel group, copied
  // from the expert exchange (parallel::ExpertDispatcher) by MoELayer; empty on one rank.
  std::vector<int64_t> send_counts, recv_counts;

  int64_t num_slots() const;  // M
  int64_t dropped() const;    // assignments dropped by capacity: N*k - M
};
// The op-level name of the plan's index tables.
using RoutingTable = DispatchPlan;
// Slots in expert order; inside an expert in GShard priority order (every token's 1st choice in
// token order, then every 2nd choice, ...); capacity 0 = dropless, else at most `capacity` slots
// per expert. Throws on k > E, expert ids out of range, a token choosing one expert twice.
// Every field but send_counts / recv_counts is filled in.
DispatchPlan build_routing(const Tensor& topk_idx, const Tensor& topk_weight, int64_t num_experts,
                           int64_t capacity);
// x_perm [M,D]: x_perm[s] = x[token_of_slot[s]].
void gather_rows(const Tensor& x, const Tensor& token_of_slot, Tensor& x_perm);
// y [N,D]: y[t] = sum over kept j of w[s] * rows[s], s = slot_of[t*k+j], in choice order.
// weight_of_slot undefined: weight 1 (the backward of gather_rows).
void combine_rows(const Tensor& rows, const Tensor& slot_of, const Tensor& weight_of_slot,
                  int64_t top_k, Tensor& y);
// dy_perm [M,D] = w[s] * dy[token_of_slot[s]], dweight_of_slot [M] = <dy[token], y_perm[s]>.
void combine_rows_backward(const Tensor& dy, const Tensor& y_perm, const Tensor& token_of_slot,
                           const Tensor& weight_of_slot, Tensor& dy_perm, Tensor& dweight_of_slot);
// dtopk_weight [N,k] = dweight_of_slot[slot_of] (0 where dropped).
void slot_to_choice(const Tensor& dweight_of_slot, const Tensor& slot_of, Tensor& dtopk_weight);

// ---- grouped expert GEMM (ops/grouped_gemm.cpp) ----

// For every expert segment: c_seg = a_seg op(w[e]) + beta c_seg, w [E,R,S],
// op(w[e]) = w[e]^T [S,R] when transpose_w, else w[e] [R,S]. One GEMM per non-empty segment (two
// when K is not a multiple of 64: the sum over K is cut at fixed places, so the result does not
// depend on the thread count).
void grouped_gemm(const Tensor& a, const Tensor& w, bool transpose_w,
                  const std::vector<int32_t>& offsets, Tensor& c, float beta = 0.0f);
// dw[e] += dy_seg^T x_seg for every segment: dy [M,R], x [M,S], dw [E,R,S]. The sum over rows is
// cut at fixed places, so the result does not depend on the thread count (use it for any parameter
// gradient summed over tokens: one segment, offsets {0, M}, dw reshaped to [1,R,S]).
void grouped_gemm_weight_grad(const Tensor& dy, const Tensor& x,
                              const std::vector<int32_t>& offsets, Tensor& dw);
// Fused bias + activation over the rows of h [M,F] (bias [E,F] or undefined):
// gelu: h += b1[e] (kept as the pre-activation), a = gelu(h);
// swiglu: h += b1[e], a = silu(h) * h3;
// swiglu_clamped: h += b1[e] (kept unclamped), g = min(h, limit), u = clamp(h3, -limit, limit),
// a = (u + 1) * g * sigmoid(alpha g) (the up projection's bias is added to h3 beforehand,
// grouped_add_bias). `clamp` is read by swiglu_clamped only.
void expert_activation(Tensor& h, const Tensor& h3, const Tensor& bias,
                       const std::vector<int32_t>& offsets, Activation activation, Tensor& a,
                       SwigluClamp clamp = {});
// gelu: dh = da * gelu'(h); swiglu: dh = da * h3 * silu'(h), dh3 = da * silu(h);
// swiglu_clamped: dh = da (u + 1) s (1 + alpha g (1 - s)), s = sigmoid(alpha g), zero where
// h > limit; dh3 = da g s, zero where |h3| > limit (at exactly the limit both pass, as torch's
// clamp). dh may alias da.
void expert_activation_backward(const Tensor& da, const Tensor& h, const Tensor& h3,
                                Activation activation, Tensor& dh, Tensor& dh3,
                                SwigluClamp clamp = {});
// y[row] += bias[e] for the rows of each segment (y [M,D], bias [E,D]).
void grouped_add_bias(Tensor& y, const Tensor& bias, const std::vector<int32_t>& offsets);
// dbias[e] += sum of the rows of segment e of dy (fixed row order per column).
void grouped_bias_grad(const Tensor& dy, const std::vector<int32_t>& offsets, Tensor& dbias);

}  // namespace moe::ops
