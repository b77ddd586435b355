// Memory per device by tier (moe/plan/memory_model.h). Each term is its own function so that
// its bytes can be checked by hand (tests/unit/test_plan_memory.cpp).
#include "moe/plan/memory_model.h"

#include <algorithm>
#include <cmath>

#include "moe/error.h"
#include "moe/models/flavour.h"

namespace moe::plan {

StateBytes state_bytes(DType dtype) {
  StateBytes b;
  b.value = double(dtype_size(dtype));
  b.master = dtype == DType::f32 ? 0 : 4;  // bf16/f16 values train through an fp32 master
  return b;                                // AdamW m and v, the gradient: fp32
}

double dense_state_bytes(double P, const StateBytes& b, int stage, int64_t ranks) {
  const double R = double(std::max<int64_t>(ranks, 1));
  switch (stage) {
    case 0:
      return P * b.total();
    case 1:
      return P * (b.value + b.grad) + P * b.optimizer() / R;
    case 2:
      return P * b.value + P * (b.optimizer() + b.grad) / R;
    default:
      return P * b.total() / R;
  }
}

double experts_held_per_rank(const ModelConfig& c, const Layout& l) {
  double held = 0;
  for (int64_t E : c.experts_per_layer) {
    if (E == 0) continue;
    if (l.placement == Placement::fixed) held += double(E / l.ep);
    if (l.placement == Placement::lpt) held += double(E);
    if (l.placement == Placement::flexmoe) held += double(std::min(E, (E + l.ep - 1) / l.ep + 1));
  }
  return held;
}

namespace {

// Elements one block's attention saves per token: q, k, v and the attention output; latent
// attention's q and k are H x (qk_nope + qk_rope) wide, its v and output H x v_head_dim, and it
// keeps its normed latents (kv_lora_rank, and q_lora_rank when q has one).
double attention_saved(const ModelConfig& c) {
  const double H = double(std::max<int64_t>(c.heads, 1));
  const double hd = c.heads > 0 ? double(c.head_dim_resolved()) : double(c.d_model);
  if (c.mla()) {
    const double v = H * double(c.v_head_dim);
    return 2 * H * hd + 2 * v + double(c.kv_lora_rank + c.q_lora_rank);
  }
  return 2 * H * hd + 2 * double(c.kv_heads_resolved()) * hd;
}

}  // namespace

double activation_bytes_per_token(const ModelConfig& c) {
  const double a = double(dtype_size(c.dtype));
  const double D = double(c.d_model), T = double(c.seq);
  const double hidden = moe::gated(flavour_of(c).activation) ? 3 : 2;
  double bytes = 0;
  for (int64_t l = 0; l < c.layers; ++l) {
    // two norm inputs and attention's rows; the [heads, T] probabilities in fp32
    bytes += a * (2 * D + attention_saved(c)) + 4 * double(c.heads) * T;
    const bool moe = c.is_moe_layer(l);
    const double rows = moe ? double(c.residual_moe ? 1 : c.top_k) : 1;
    const double F = moe ? double(c.d_ff) : double(c.dense_ff_resolved());
    bytes += a * rows * (D + hidden * F);  // each expert's input row and hidden rows
    if (moe && c.shared_expert_ff > 0) bytes += a * hidden * double(c.shared_expert_ff);
    if (moe && c.residual_moe) bytes += a * hidden * double(c.d_ff);  // the residual MLP
  }
  return bytes + 4 * double(c.vocab_size);  // the logits, fp32
}

bool MemoryPlan::fits() const {
  for (int t = 0; t < 3; ++t)
    if (shortfall(t) > 0) return false;
  return true;
}

int64_t ssd_cache_experts(const MemoryInput& in) {
  const double held = experts_held_per_rank(in.config, in.layout);
  return int64_t(std::max(1.0, std::ceil(in.active_fraction * held)));
}

MemoryPlan plan_memory(const MemoryInput& in) {
  MemoryPlan plan;
  const ModelConfig& c = in.config;
  const Layout& l = in.layout;
  const ParamCounts p = param_counts(c);
  const StateBytes b = state_bytes(c.dtype);
  const int64_t ranks = l.ep * l.dp;
  const bool host_pool = in.cluster.device_is_host;
  auto add = [&](int tier, std::string what, double bytes) {
    if (host_pool && tier == 1) tier = 0;  // one memory: the host tier is the device's
    plan.items.push_back({kTierNames[tier], std::move(what), bytes});
    plan.need[tier] += bytes;
  };
  // The frozen router biases keep an f32 value and gradient on every rank, and no AdamW state.
  add(0, str("dense state (zero=", l.zero, ")"),
      dense_state_bytes(p.dense - p.frozen, b, l.zero, ranks) + 8 * p.frozen);
  if (l.zero == 3) add(0, "dense values gathered for one block (zero=3)", p.block_dense * b.value);
  const double held = experts_held_per_rank(c, l);
  const double record = p.per_expert * b.total();
  if (l.offload == OffloadTier::none) {
    add(0, "experts' state", held * record);
  } else {
    // The device computes from four fp32 expert slots (offload/plan.cpp's unit) beside the dense
    // state; the records live in host memory, or on SSD behind a host cache of a step's experts.
    add(0, "expert slots (4 fp32 experts)", 4 * 4 * p.per_expert);
    if (l.offload == OffloadTier::host) {
      add(1, "experts' state", held * record);
    } else {
      add(1, "host cache of a step's experts", double(ssd_cache_experts(in)) * record);
      add(2, "experts' state", held * record);
    }
  }
  add(0, "activations", double(in.tokens_per_rank) * activation_bytes_per_token(c));
  const double per_node = double(in.cluster.devices_per_node);
  plan.capacity[0] = in.cluster.device_bytes;
  plan.capacity[1] = host_pool ? 0 : in.cluster.host_bytes / per_node;
  plan.capacity[2] = in.cluster.ssd_bytes / per_node;
  return plan;
}

}  // namespace moe::plan
