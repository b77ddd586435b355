// Top-k router of an MoE layer (Switch/GShard): logits = x Wg^T (+ an optional learned logit bias),
// scores in fp32 (softmax over all
// experts, or DeepSeek-V3's sigmoid per expert), top-k (optionally on scores plus a per-expert
// selection bias; optionally renormalised), capacity, aux load-balancing loss and z-loss, and the
// DispatchPlan handed to dispatch/combine; and the aux-loss-free bias update.
// Shapes: N tokens, D model width, E experts, k experts per token, M kept assignments.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moe/nn/common.h"
#include "moe/nn/dispatch.h"
#include "moe/param.h"

namespace moe::nn {

struct RouterConfig {
  int64_t d_model = 0, num_experts = 0, top_k = 1;
  bool normalize_topk = false;  // renormalise the k gate weights to sum to 1 (mixtral: true)
  // Switch jitter: in training the router (only; the experts see x) reads x * U(1-jitter,
  // 1+jitter), Philox keyed by (seed, step, layer).
  float jitter = 0.0f;
  float capacity_factor = 0.0f;  // 0 = dropless
  float init_std = 0.02f;
  RouterScoring scoring = RouterScoring::softmax;
  // A per-expert selection bias b [E] (DeepSeek-V3): top-k picks the largest scores + b, the gate
  // weights stay the scores. Param prefix + ".bias", zeros at first, frozen (Param::frozen: no
  // gradient, no optimizer update); update_selection_bias moves it after each training step.
  bool selection_bias = false;
  // A learned logit bias b [E] (gpt-oss's router.bias): logits = x Wg^T + b, before the scores,
  // the top-k and the losses; trained like the weight (no weight decay). Param prefix +
  // ".logit_bias", zeros at first. Unlike selection_bias it changes the gate weights too. With
  // softmax scoring and normalize_topk, the gate weights are the softmax of the k chosen logits
  // (gpt-oss's softmax over the top-k values: the softmax over all E renormalised over the k is
  // the same function).
  bool logit_bias = false;
  // Group-limited choice (DeepSeek-V3, GLM-4-MoE: n_group, topk_group): experts in `groups` equal
  // groups, top-k only within the group_topk groups of the largest two-best sums
  // (ops::router_topk).
  int64_t groups = 1, group_topk = 1;
  // Every gate weight times this after the (optional) renormalisation (routed_scaling_factor).
  float gate_scale = 1.0f;
  // Centring: a running mean c [D] of the router's input (param prefix + ".center", f32, zeros at
  // first, frozen; update_router_center moves it after each training step). The logits use the
  // weight W' = W - C (W c) c^T / |c|^2, C = I - 1 1^T / E (centring over the experts): moving a
  // token along c changes all its logits alike, so routing ignores the component every token
  // shares (at d_model 512 most of the normalised residual stream; without this the shared part
  // sends every token to the same experts). W' is a plain linear map: exports write it as the
  // router weight. The gradient reaching W is dW' projected the same way. c = 0: W' = W.
  bool center = false;
};

struct RouterStep {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t layer = 0;
  bool training = true;
  // Index of this call's first token in the global batch (data parallelism: rank r's share
  // starts at r N), so that each token's jitter noise is the one a single process draws for it.
  int64_t first_token = 0;
  // Copy each token's chosen experts and gate weights into MoEStats (routing traces).
  bool capture_routing = false;
  // Centred routers: sum the router's input into MoEStats (always so in training; evaluation
  // passes ask for it to calibrate the centers, Trainer's first step).
  bool input_sums = false;
  // Inference: tokens a block when the MoE layer runs its experts by blocks (0: 256 MiB of the
  // experts' rows a block, at least 1,024 tokens; nn::MoELayer).
  int64_t expert_block_tokens = 0;
};

struct RouterOutput {
  DispatchPlan plan;
  // [N,E] fp32. softmax: probs = softmax over all E experts, scores = probs (the same tensor).
  // sigmoid: scores = sigmoid(logits), probs = scores / their row sum (the aux loss's P_e).
  Tensor logits, probs, scores;
  Tensor lse;  // [N] logsumexp of each logits row (z-loss)
  // [N,k] i32 / f32: the chosen scores (optionally renormalised), times gate_scale
  Tensor topk_idx, topk_weight;
  Tensor routed_input;   // x after jitter (x itself without jitter)
  Tensor weight;         // [E,D] the weight the logits used (W', or W itself)
  bool centred = false;  // weight is W' (on a GPU always; on the host while c != 0): backward
                         // projects dW'
  Tensor jitter_noise;   // [N,D] or undefined
  double aux_loss = 0, z_loss = 0;
  std::vector<int64_t> load;  // [E] assignments per expert before capacity
  // Tokens `load` counts (N here; the global batch once MoELayer sums load over data-parallel
  // ranks, so that f_e of the aux loss describes the whole batch).
  int64_t load_tokens = 0;
};

// Philox key of the jitter noise of one (seed, step, layer); element (t, d) of the noise is
// kernels::jitter_factor(key, (step.first_token + t)*D + d, jitter).
uint64_t router_jitter_key(const RouterStep& step);
// C = ceil(capacity_factor * N * k / E) when capacity_factor > 0, else 0 (dropless).
int64_t router_capacity(float capacity_factor, int64_t num_tokens, int64_t top_k,
                        int64_t num_experts);

// aux_loss = E * sum_e f_e * P_e (Switch/GShard; f is constant for the gradient), where
//   f_e = load_e / (load_tokens*k): assignments to e over all k choices, before capacity, of the
//   load_tokens tokens counted (N, or the global batch under data parallelism),
//   P_e = mean over this call's N tokens of probs[t,e] (under sigmoid scoring the scores
//   normalised to sum 1 per token, as DeepSeek-V3's sequence-wise balance loss does, here over
//   the call's tokens);
// z_loss = mean_t logsumexp(logits_t)^2 (under either scoring).
// Params: prefix + ".weight" [E, D] (router linear), e.g. "blocks.1.moe.router.weight"; with
// logit_bias prefix + ".logit_bias" [E]; with selection_bias prefix + ".bias" [E]; with center
// prefix + ".center" [D].
class Router {
 public:
  Router(ParamSet& ps, const std::string& prefix, const RouterConfig& config);
  RouterOutput forward(const Tensor& x, const RouterStep& step) const;
  // The experts forward (in inference: no jitter) would choose for x [N,D], by the same scores,
  // selection bias and groups, k a token (at least top_k; at most what the chosen groups hold):
  // [N,k] i32, best first. Nothing else is computed (no plan, no losses).
  Tensor choose(const Tensor& x, int64_t k) const;
  // dweight_of_slot: d loss / d plan.weight_of_slot [M]; aux_scale, z_scale: d loss / d aux_loss,
  // d loss / d z_loss. Accumulates into the weight's (and the logit bias's) gradient; returns
  // dx [N,D].
  Tensor backward(const Tensor& dweight_of_slot, const RouterOutput& out, const Tensor& x,
                  float aux_scale, float z_scale);
  const RouterConfig& config() const { return config_; }
  Param& weight() const { return *weight_; }
  Param* selection_bias() const { return bias_; }    // null without one
  Param* logit_bias() const { return logit_bias_; }  // null without one
  Param* center() const { return center_; }          // null without one
  // The weight the logits use: W' (RouterConfig::center) when the center is nonzero, else W.
  Tensor effective_weight() const;

 private:
  RouterConfig config_;
  Param* weight_;
  Param* bias_ = nullptr;
  Param* logit_bias_ = nullptr;
  Param* center_ = nullptr;
};

// Aux-loss-free balancing (DeepSeek-V3), after an optimizer step: b_e += rate * sign(mean load -
// load_e) with load [E] the step's assignments per expert over the global batch (so that every
// rank applies the same change), sign(0) = 0 (compared exactly, in integers). The sum runs in
// fp32 on the stored values (bf16/f16 parameters round the result to their dtype).
void update_selection_bias(Param& bias, const std::vector<int64_t>& load, double rate);

// m - C (m c) c^T / |c|^2 for m [E,D] and c [D] on the host, any float dtype (f32 arithmetic, sums
// in double in index order, ops::router_center_weight; the result in m's dtype). c = 0: m itself.
// What exports write as the router weight, and the router's effective weight and its gradient's
// projection on the host (an f32 router on a GPU runs ops::router_center_weight there, same bits).
Tensor center_router_weight(const Tensor& m, const Tensor& center);

// Router centring, after an optimizer step: c = mean while c is all zero (the first step), then
// c += rate (mean - c), where mean = input_sum / tokens is the step's mean router input over the
// global batch (summed over micro-batches and ranks, so every rank applies the same change).
void update_router_center(Param& center, const std::vector<double>& input_sum, int64_t tokens,
                          double rate);

}  // namespace moe::nn
