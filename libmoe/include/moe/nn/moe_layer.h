// The MoE layer: Router -> DispatchPlan -> dispatch -> Experts (grouped GEMM) -> combine, plus an
// optional always-on shared expert (DeepSeek-MoE, Qwen2-MoE; gated per token in Qwen2-MoE), and its
// backward. Tokens whose every choice was dropped by capacity get 0 (the block's residual carries
// them). The plan and every activation backward needs travel in Saved, never on `this`.
// Shapes: N tokens, D model width, F expert hidden width, E experts, k experts per token,
// M kept assignments, S the shared expert's hidden width.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe/nn/experts.h"
#include "moe/nn/linear.h"
#include "moe/nn/mlp.h"
#include "moe/nn/parallel.h"
#include "moe/nn/recompute.h"
#include "moe/nn/router.h"
#include "moe/parallel/expert_dispatcher.h"

namespace moe::nn {

struct MoEConfig {
  RouterConfig router;  // router.num_experts == experts.num_experts, d_model equal
  ExpertsConfig experts;
  int64_t block = -1;  // the block's index in the model (a placement policy's key; -1: none)
  // Shared expert: an MLP of hidden width shared_ff (0 = none) with the experts' activation and
  // biases (nn::MLP, params prefix.shared.w1 [S,D], w3 [S,D] (swiglu), w2 [D,S]), every token's
  // output added to the routed output. With shared_gate (Qwen2-MoE) it is scaled per token by
  // sigmoid(x . w), w = prefix.shared_gate.weight [1,D]. Dense: not an expert, never sharded or
  // offloaded; each rank computes it on its own tokens, its gradients are data-parallel.
  int64_t shared_ff = 0;
  bool shared_gate = false;
};

struct MoEStats {
  double aux_loss = 0, z_loss = 0;
  std::vector<int64_t> load;  // [E] before capacity
  bool load_global = false;   // load already summed over the data-parallel ranks
  // With RouterStep::capture_routing: token t's j-th choice (t*k + j), on the heap (not the
  // activation arena), and its gate weight (after the optional renormalisation).
  std::vector<int32_t> choices;
  std::vector<float> gates;
  std::vector<int32_t> tokens_per_expert;  // [E] kept
  int64_t assignments = 0, dropped = 0;    // N*k and dropped by capacity
  // Rows this rank's experts computed (under expert parallelism: the rows that arrived here).
  int64_t rows_computed = 0;
  // A centred router in training (RouterConfig::center): the sum over this pass's tokens of the
  // router's input [D] (before jitter), and their count; update_router_center's mean.
  std::vector<double> input_sum;
  int64_t input_tokens = 0;
};

// prefix e.g. "blocks.1.moe": router at prefix + ".router", experts at prefix + ".experts"
//
// With a Parallel layout (null: one process):
// - data parallel: the router's expert loads are summed over parallel->batch before the aux loss,
//   so each rank's aux loss uses the global batch's f_e (and the mean of the ranks' aux losses is
//   the single-process aux loss of the global batch). Capacity stays per rank: C is computed from
//   this rank's N tokens and applied to them (as DeepSpeed and Megatron do).
// - expert parallel (P ranks): this rank holds experts [p E/P, (p+1) E/P) (E % P != 0 is a
//   UsageError). Forward: route and permute locally (slots are in expert order, so rank order);
//   exchange the per-expert counts ([P, E/P] integers, one all-to-all); all-to-all-v the rows to
//   the ranks owning their experts; regroup the arrivals from (source, expert) to (expert, source)
//   order; one grouped GEMM over the local experts; undo the regrouping; all-to-all-v back;
//   combine (the exchange is parallel::ExpertDispatcher's dispatch and combine). Backward mirrors
//   it with two more all-to-all-v. The router and its gradient stay local. Rows of one expert are
//   summed in (source rank, slot) order, a different float order than one process's (slot order
//   over the global batch).
// - dynamic placement (parallel->placement: Lina in inference, FlexMoE and LPT in training):
//   every rank holds all E experts; after the router, the policy assigns each expert to one or
//   more ranks (ExpertAssignment), each source sends its rows of e in chunks to e's replicas, and
//   the same exchange as above runs over "held" experts that are now all E (most segments empty).
//   Backward reuses the forward's exchange, so a rank's expert gradients cover the rows it
//   computed; the trainer sums them over the ranks (parallel::GradSync).
// Tokens a block when inference runs the experts by blocks and RouterStep::expert_block_tokens is
// 0: 64 Mi floats (256 MiB) of the experts' rows (top_k x (2 d_model + 3 d_ff) floats a token),
// at least 1,024 tokens (OLMoE-1B-7B: 1,170). models/memory's estimate cuts its blocks the same.
int64_t default_expert_block_tokens(int64_t top_k, int64_t d_model, int64_t d_ff);

class MoELayer {
 public:
  MoELayer(ParamSet& ps, const std::string& prefix, const MoEConfig& config,
           const Parallel* parallel = nullptr);

  // Expert parallelism: the movement of one step's rows between ranks (planned by the
  // dispatcher, kept for backward).
  using Exchange = parallel::ExpertExchange;

  struct Saved {
    Tensor x;             // [N,D]
    RouterOutput router;  // plan (with send/recv counts under EP), probs, choices, jitter noise
    Tensor x_perm;        // [M,D]
    Exchange exchange;    // expert parallel only
    int64_t block = 0;    // RouterStep::layer of the forward (for the exchange statistics)
    Experts::Saved experts;
    Tensor y_perm;      // [M,D]
    MLP::Saved shared;  // the shared expert's activations
    Tensor shared_y;    // [N,D] its output before the gate (gated only)
    Tensor shared_g;    // [N,1] sigmoid(x . w) (gated only)
    // Set by the caller before forward to recompute the experts (--recompute moe): forward then
    // keeps only experts.x_perm (the rows this rank computes, after the all-to-all under expert
    // parallelism) and experts.expert_offsets, and backward runs Experts::forward on them again
    // in this scratch before Experts::backward. The exchange is not repeated; the recomputed
    // activations are bitwise the first ones (same rows, same weights, deterministic kernels).
    Scratch* recompute_experts = nullptr;
  };

  // [N,D]; saved and stats may be null.
  Tensor forward(const Tensor& x, const RouterStep& step, Saved* saved, MoEStats* stats) const;
  // Returns dx [N,D]; accumulates (+=) into the router's and experts' parameter gradients.
  Tensor backward(const Tensor& dy, const Saved& saved, float aux_scale, float z_scale);
  // Inference, a store that reads ahead (ExpertStore::lookahead): the experts this layer's router
  // chooses for u [N,D] (an earlier hidden state, normalised as this layer's input is), top_k +
  // margin a token, handed to the store as this layer's prediction. Nothing is routed or counted.
  void predict(const Tensor& u, int64_t margin) const;

  const MoEConfig& config() const { return config_; }  // experts: the ones held here
  Router& router() { return router_; }
  const Router& router() const { return router_; }
  Experts& experts() { return experts_; }
  const Experts& experts() const { return experts_; }
  const MLP* shared() const { return shared_.get(); }

 private:
  static MoEConfig checked(const std::string& prefix, const MoEConfig& config,
                           const Parallel* parallel);
  void globalize_load(RouterOutput& routed) const;
  parallel::ExpertDispatcher dispatcher() const;
  void add_seconds(int64_t block, double seconds) const;  // into parallel_->stats, when set
  Tensor run_experts(const Tensor& x_perm, RouterOutput& routed, const RouterStep& step,
                     Saved* saved, int64_t& rows_computed) const;
  Tensor experts_forward(const Tensor& x_local, const std::vector<int32_t>& offsets,
                         Saved* saved) const;
  Tensor experts_backward_local(const Tensor& dy_local, const Saved& saved);
  Tensor experts_backward(const Tensor& dy_perm, const Saved& saved);
  // Inference on one process with dropless routing: dispatch, experts and combine of blocks of
  // tokens in turn (in the calling thread's scratch), so the experts' activations are a block's.
  // Whether forward takes this path, and the block's tokens.
  int64_t expert_block_tokens(const Tensor& x, const RouterOutput& routed, const RouterStep& step,
                              const Saved* saved) const;
  Tensor experts_by_blocks(const Tensor& x, const RouterOutput& routed, int64_t block) const;
  void shared_forward(const Tensor& x, Tensor& y, Saved* saved) const;     // y += shared(x)
  void shared_backward(const Tensor& dy, const Saved& saved, Tensor& dx);  // dx += ...
  MoEConfig config_;
  const Parallel* parallel_ = nullptr;
  Router router_;
  Experts experts_;
  std::unique_ptr<MLP> shared_;          // shared_ff > 0
  std::unique_ptr<Linear> shared_gate_;  // shared_gate
};

}  // namespace moe::nn
