// Memory per device by tier for a layout on a cluster: MoESys's capacity inequalities (eq. 1:
// device 16 D + 4 alpha S / L <= M_GPU N, host 16 alpha S <= M_CPU N, SSD 12 S <= M_SSD N),
// written with this library's bytes per parameter (offload/plan.h's record: the stored value, an
// fp32 master for bf16/f16, AdamW's m and v, the fp32 gradient), ZeRO's sharding of the dense
// state, expert parallelism's share of the experts, and the activations the training step saves.
//
// Shape letters: P dense parameters, S expert parameters (every expert of every layer), Pe one
// expert's, R ranks, L MoE layers, alpha the fraction of experts a step touches (from the trace).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moe/models/config.h"
#include "moe/plan/cluster.h"
#include "moe/plan/layout.h"

namespace moe {
struct Flavour;  // moe/models/flavour.h
}

namespace moe::plan {

// Bytes per parameter of each part of a parameter's training state.
struct StateBytes {
  double value = 4, master = 0, adam = 8, grad = 4;
  double total() const { return value + master + adam + grad; }
  double optimizer() const { return master + adam; }  // what ZeRO 1 shards
};
StateBytes state_bytes(DType dtype);

// The dense state per device under ZeRO `stage` over `ranks` ranks (P = dense parameters):
// 0 everything replicated; 1 master + AdamW sharded; 2 and gradients; 3 and values.
double dense_state_bytes(double dense_params, const StateBytes& b, int stage, int64_t ranks);

// The model's parameters, exactly those the Transformer creates (Transformer::num_params() is
// dense + per_expert x experts; tests/unit/test_plan_params.cpp checks it for every family): the
// token table, GPT's position table, the untied head, every norm and bias, attention's q/k/v/o at
// its head width (head_dim may differ from D / H), latent attention's projections and norms, the
// qk-norms, routers with their selection bias, shared experts with their gate, dense MLP layers
// at their own width (dense_ff).
struct ParamCounts {
  double dense = 0;        // P: every parameter that is not an expert's
  double frozen = 0;       // of P: routers' selection biases and centres (f32, no optimizer state)
  double f32_trained = 0;  // of P: trained values kept f32 in any dtype (gpt-oss's attention sinks)
  double per_expert = 0;   // Pe: one expert's weights and biases
  int64_t experts = 0;     // every expert of every MoE layer
  int64_t moe_layers = 0;  // L
  double block_dense = 0;  // the largest block's dense parameters (ZeRO 3 gathers one)
  double total() const { return dense + per_expert * double(experts); }
  // Bytes of every stored value: `dtype`, the frozen ones and f32_trained f32 (the ParamSet's).
  double value_bytes(DType dtype) const;
};
ParamCounts param_counts(const ModelConfig& config);  // config resolved
// The same with `flavour` in place of flavour_of(config): a family's layer choices (gated
// experts with biases, the router's logit bias) counted before a ModelConfig arch selects them.
ParamCounts param_counts(const ModelConfig& config, const Flavour& flavour);

// Experts whose state one rank holds, over every MoE layer: its E/ep share under static placement,
// every expert under lpt (moe-train keeps all of them current on every rank), FlexMoE's default
// V = ceil(E/ep) + 1 vExpert slots per layer under flexmoe.
double experts_held_per_rank(const ModelConfig& config, const Layout& layout);

// Bytes a training step saves per token for backward (a lower bound of the same kind): per layer
// the norm inputs, q, k, v, the attention output and its [heads, seq] fp32 probabilities, the
// experts' (or dense MLP's) hidden rows of its top_k choices; the logits (fp32) once.
double activation_bytes_per_token(const ModelConfig& config);

struct MemoryItem {
  std::string tier;  // device | host | ssd
  std::string what;  // "dense state (zero=1)", "experts' state", ...
  double bytes = 0;  // per device
};

struct MemoryPlan {
  std::vector<MemoryItem> items;
  double need[3] = {0, 0, 0};      // device, host, ssd: bytes per device
  double capacity[3] = {0, 0, 0};  // per device (host and SSD: the node's / devices per node)
  // Positive: what does not fit, per device; device_is_host clusters count host items on the
  // device pool (need[1] is then 0 and so is capacity[1]).
  double shortfall(int tier) const { return need[tier] - capacity[tier]; }
  bool fits() const;
};
inline constexpr const char* kTierNames[3] = {"device", "host", "ssd"};

struct MemoryInput {
  ModelConfig config;  // resolved
  Layout layout;       // checked (dp resolved)
  ClusterSpec cluster;
  int64_t tokens_per_rank = 0;  // batch * seq of one rank's step
  double active_fraction = 1;   // alpha: experts a step touches / all (the trace's mean)
};
MemoryPlan plan_memory(const MemoryInput& input);

// offload=ssd: the experts the host cache holds per rank, ceil(alpha x held), at least one.
int64_t ssd_cache_experts(const MemoryInput& input);

}  // namespace moe::plan
