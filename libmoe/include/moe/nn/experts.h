// The experts of one MoE layer, run as a grouped GEMM over the variable-size contiguous segments
// of the permuted buffer (ES-MoE, MegaBlocks): no padding to a capacity, no per-expert copies.
// gpt: y = W2 gelu(W1 x + b1) + b2;  mixtral: y = W2 (silu(W1 x) * W3 x);
// gpt-oss: y = W2 ((clamp(W3 x + b3) + 1) * glu(min(W1 x + b1, limit))) + b2 (swiglu_clamped).
// Shapes: M rows of the permuted buffer (kept assignments), D model width, F expert hidden width,
// E experts.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moe/nn/common.h"
#include "moe/nn/expert_store.h"
#include "moe/param.h"

namespace moe::nn {

struct ExpertsConfig {
  int64_t num_experts = 0, d_model = 0, d_ff = 0;  // num_experts: the experts held here
  Activation activation = Activation::gelu;
  bool bias = true;
  float init_std = 0.02f, out_init_std = 0.02f;
  // Expert parallelism: this rank holds experts [first_expert, first_expert + num_experts) of a
  // layer of global_experts (0 = num_experts: all of them). Parameters are then ParamShards of the
  // [global_experts, ...] tensors, with the single-process initial values.
  int64_t global_experts = 0, first_expert = 0;
  // FlexMoE's vExpert slots (training with --placement flexmoe): num_experts slots, slot i
  // starting as logical expert slot_experts[i] of global_experts (-1: empty). Parameters are then
  // [num_experts, ...] tensors made by ParamSet::add_rows.
  std::vector<int64_t> slot_experts = {};
  // swiglu_clamped's alpha and limit (read by it only). Last, so that the aggregate initialisers
  // {E, D, F, activation, bias} above keep their meaning.
  SwigluClamp clamp = {};
};

// Params (ParamSet::add(..., expert=true)): prefix.w1 [E,F,D], prefix.w2 [E,D,F],
// prefix.w3 [E,F,D] (gated: swiglu, swiglu_clamped), prefix.b1 [E,F], prefix.b2 [E,D] (bias only),
// prefix.b3 [E,F] (bias and gated: the up projection's, added to W3 x before the activation).
//
// With an ExpertStore the Params are Param::offloaded and the store holds the experts: forward
// and backward then run one expert at a time through the store's protocol
// (moe/nn/expert_store.h), the same grouped ops on each expert's rows as a group of one. The
// CPU grouped GEMM computes each segment's tiles independently of the other segments, so both
// paths give bitwise the same outputs and gradients. A store that serves whole layers (the
// inference ring) hands over all the layer's experts at once, and forward runs exactly the
// resident path's calls on them.
class Experts {
 public:
  Experts(ParamSet& ps, const std::string& prefix, const ExpertsConfig& config,
          ExpertStore* store = nullptr);

  // What backward needs; activations of one step (arena-allocated when the caller has a scope).
  struct Saved {
    Tensor x_perm;                        // [M,D]
    std::vector<int32_t> expert_offsets;  // [E+1]
    Tensor h;                             // [M,F] pre-activation W1 x + b1
    Tensor h3;                            // [M,F] W3 x + b3 (gated)
    Tensor a;                             // [M,F] activation, the input of W2
  };

  // x_perm [M,D] in expert order, segments given by expert_offsets [E+1]; returns y_perm [M,D].
  Tensor forward(const Tensor& x_perm, const std::vector<int32_t>& expert_offsets,
                 Saved* saved) const;
  // Returns dx_perm [M,D]; accumulates (+=) into the experts' parameter gradients.
  Tensor backward(const Tensor& dy_perm, const Saved& saved);

  const ExpertsConfig& config() const { return config_; }
  ExpertStore* store() const { return store_; }     // null: resident Params
  int store_layer() const { return store_layer_; }  // the store's id of this layer (-1: none)
  Param& w1() const { return *w1_; }
  Param& w2() const { return *w2_; }
  Param* w3() const { return w3_; }  // null unless gated
  Param* b1() const { return b1_; }  // null without bias
  Param* b2() const { return b2_; }
  Param* b3() const { return b3_; }  // null without bias or unless gated

 private:
  ExpertTensors resident() const;  // the Params' fp32 views, [E,...]
  ExpertTensors resident_gradients() const;
  ExpertsConfig config_;
  ExpertStore* store_ = nullptr;
  int store_layer_ = -1;
  Param* w1_ = nullptr;
  Param* w2_ = nullptr;
  Param* w3_ = nullptr;
  Param* b1_ = nullptr;
  Param* b2_ = nullptr;
  Param* b3_ = nullptr;
};

}  // namespace moe::nn
