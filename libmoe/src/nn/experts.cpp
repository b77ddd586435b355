// Experts forward/backward as grouped GEMMs (see moe/nn/experts.h).
// Shapes: M rows of the permuted buffer, D model width, F expert hidden width, E experts.
#include "moe/nn/experts.h"

#include "moe/ops/moe.h"

namespace moe::nn {

Experts::Experts(ParamSet& ps, const std::string& prefix, const ExpertsConfig& config,
                 ExpertStore* store)
    : config_(config), store_(store) {
  MOE_USAGE_CHECK(config.num_experts > 0 && config.d_model > 0 && config.d_ff > 0, "experts ",
                  prefix, ": num_experts, d_model and d_ff must be positive (got ",
                  config.num_experts, ", ", config.d_model, ", ", config.d_ff, ")");
  const int64_t E = config.num_experts, D = config.d_model, F = config.d_ff;
  const int64_t G = config.global_experts ? config.global_experts : E;
  MOE_USAGE_CHECK(
      !config.slot_experts.empty() || (config.first_expert >= 0 && config.first_expert + E <= G),
      "experts ", prefix, ": experts [", config.first_expert, ", ", config.first_expert + E,
      ") are not within the layer's ", G);
  MOE_CHECK(config.slot_experts.empty() ||
                (!store && static_cast<int64_t>(config.slot_experts.size()) == E),
            "experts ", prefix, ": ", config.slot_experts.size(), " slot experts for ", E, " slots",
            store ? " (slots cannot be offloaded)" : "");
  MOE_USAGE_CHECK(config.activation != Activation::swiglu_clamped ||
                      (config.clamp.limit > 0.0f && config.clamp.limit <= 3.0e38f &&
                       config.clamp.alpha > -3.0e38f && config.clamp.alpha < 3.0e38f),
                  "experts ", prefix, ": the clamped SwiGLU needs a positive finite limit and a ",
                  "finite alpha (got limit ", config.clamp.limit, ", alpha ", config.clamp.alpha,
                  ")");
  auto add = [&](const char* name, Shape rest, Init init, bool decay) -> Param* {
    Shape global{G};
    global.insert(global.end(), rest.begin(), rest.end());
    if (store) {
      Shape local{E};
      local.insert(local.end(), rest.begin(), rest.end());
      const ParamShard shard =
          G == E ? ParamShard{} : ParamShard{global, 0, config.first_expert, E};
      return &ps.add_offloaded(prefix + name, local, shard, init, decay);
    }
    if (!config.slot_experts.empty())
      return &ps.add_rows(prefix + name, global, config.slot_experts, init, decay, true);
    if (G == E) return &ps.add(prefix + name, global, init, decay, true);
    return &ps.add_shard(prefix + name, ParamShard{global, 0, config.first_expert, E}, init, decay,
                         true);
  };
  w1_ = add(".w1", {F, D}, Init::normal(config.init_std), true);
  w2_ = add(".w2", {D, F}, Init::normal(config.out_init_std), true);
  if (gated(config.activation)) w3_ = add(".w3", {F, D}, Init::normal(config.init_std), true);
  if (config.bias) {
    b1_ = add(".b1", {F}, Init::zeros(), false);
    b2_ = add(".b2", {D}, Init::zeros(), false);
    if (gated(config.activation)) b3_ = add(".b3", {F}, Init::zeros(), false);
  }
  if (store) store_layer_ = store->add_layer({w1_, w2_, w3_, b1_, b2_, b3_});
}

// The expert ops over one group of experts: all of a layer's (resident, offsets [E+1]) or one
// expert's rows as a group of one (a store, offsets {0, rows}). Both paths run exactly these
// calls, so their results differ only in how the GEMM segments are batched, which the CPU grouped
// GEMM makes bitwise irrelevant.
static void forward_group(const ExpertTensors& w, const std::vector<int32_t>& offsets,
                          const ExpertsConfig& config, Tensor x, Tensor h, Tensor h3, Tensor a,
                          Tensor y) {
  ops::grouped_gemm(x, w.w1, true, offsets, h);
  if (gated(config.activation)) ops::grouped_gemm(x, w.w3, true, offsets, h3);
  if (w.b3.defined()) ops::grouped_add_bias(h3, w.b3, offsets);
  ops::expert_activation(h, h3, w.b1, offsets, config.activation, a, config.clamp);
  ops::grouped_gemm(a, w.w2, true, offsets, y);
  if (w.b2.defined()) ops::grouped_add_bias(y, w.b2, offsets);
}

// dy, and the forward's x, h, h3, a in; the gradients accumulate into g; dh, dh3 scratch; dx out.
static void backward_group(const ExpertTensors& w, ExpertTensors& g,
                           const std::vector<int32_t>& offsets, const ExpertsConfig& config,
                           const Tensor& dy, const Tensor& x, const Tensor& h, const Tensor& h3,
                           const Tensor& a, Tensor dh, Tensor dh3, Tensor dx) {
  if (g.b2.defined()) ops::grouped_bias_grad(dy, offsets, g.b2);
  ops::grouped_gemm_weight_grad(dy, a, offsets, g.w2);
  // dA = dY W2 (reuses no buffer: `a` stays valid for the caller).
  ops::grouped_gemm(dy, w.w2, false, offsets, dh);
  ops::expert_activation_backward(dh, h, h3, config.activation, dh, dh3, config.clamp);
  if (g.b1.defined()) ops::grouped_bias_grad(dh, offsets, g.b1);
  ops::grouped_gemm_weight_grad(dh, x, offsets, g.w1);
  ops::grouped_gemm(dh, w.w1, false, offsets, dx);
  if (gated(config.activation)) {
    if (g.b3.defined()) ops::grouped_bias_grad(dh3, offsets, g.b3);
    ops::grouped_gemm_weight_grad(dh3, x, offsets, g.w3);
    ops::grouped_gemm(dh3, w.w3, false, offsets, dx, 1.0f);
  }
}

// The experts with rows in this pass, ascending (the ones a store is asked for), and their rows.
static std::vector<int32_t> experts_with_rows(const std::vector<int32_t>& offsets,
                                              std::vector<int32_t>& rows) {
  std::vector<int32_t> used;
  rows.clear();
  for (size_t e = 0; e + 1 < offsets.size(); ++e)
    if (offsets[e + 1] > offsets[e]) {
      used.push_back(static_cast<int32_t>(e));
      rows.push_back(offsets[e + 1] - offsets[e]);
    }
  return used;
}

static Tensor optional(const Tensor& t, int32_t r0, int32_t r1) {
  return t.defined() ? t.rows(r0, r1) : Tensor();
}

Tensor Experts::forward(const Tensor& x_perm, const std::vector<int32_t>& expert_offsets,
                        Saved* saved) const {
  const int64_t D = config_.d_model, F = config_.d_ff;
  MOE_CHECK(x_perm.ndim() == 2 && x_perm.dim(1) == D, "experts ", w1_->name, ": input ",
            x_perm.describe(), " expected [M,", D, "]");
  MOE_CHECK(static_cast<int64_t>(expert_offsets.size()) == config_.num_experts + 1, "experts ",
            w1_->name, ": ", expert_offsets.size(), " offsets for ", config_.num_experts,
            " experts");
  const int64_t M = x_perm.dim(0);
  const Device device = x_perm.device();
  Tensor h = Tensor::empty({M, F}, DType::f32, device).set_name("experts.h");
  Tensor h3;
  if (gated(config_.activation))
    h3 = Tensor::empty({M, F}, DType::f32, device).set_name("experts.h3");
  Tensor a = Tensor::empty({M, F}, DType::f32, device).set_name("experts.a");
  Tensor y = Tensor::empty({M, D}, DType::f32, device).set_name("experts.y_perm");
  if (!store_) {
    forward_group(resident(), expert_offsets, config_, x_perm, h, h3, a, y);
  } else if (store_->whole_layers()) {  // the layer's experts at once, as resident ones
    std::vector<int32_t> rows;
    const std::vector<int32_t> used = experts_with_rows(expert_offsets, rows);
    store_->request(store_layer_, used, rows, Pass::forward);
    forward_group(store_->acquire_layer(store_layer_), expert_offsets, config_, x_perm, h, h3, a,
                  y);
    store_->release_layer(store_layer_);
  } else {  // one expert at a time through the store, each a group of one
    std::vector<int32_t> rows;
    const std::vector<int32_t> used = experts_with_rows(expert_offsets, rows);
    store_->request(store_layer_, used, rows, Pass::forward);
    for (int32_t e : used) {
      const int32_t r0 = expert_offsets[static_cast<size_t>(e)],
                    r1 = expert_offsets[static_cast<size_t>(e) + 1];
      const ExpertTensors w = store_->acquire(store_layer_, e);
      forward_group(w, {0, r1 - r0}, config_, x_perm.rows(r0, r1), h.rows(r0, r1),
                    optional(h3, r0, r1), a.rows(r0, r1), y.rows(r0, r1));
      store_->release(store_layer_, e);
    }
  }
  if (saved) {
    saved->x_perm = x_perm;
    saved->expert_offsets = expert_offsets;
    saved->h = h;
    saved->h3 = h3;
    saved->a = a;
  }
  return y;
}

Tensor Experts::backward(const Tensor& dy_perm, const Saved& saved) {
  const int64_t D = config_.d_model, F = config_.d_ff;
  MOE_CHECK(saved.a.defined() && saved.x_perm.defined(), "experts ", w1_->name,
            ": backward without a saved forward");
  const int64_t M = saved.x_perm.dim(0);
  dy_perm.expect_shape({M, D}, "experts backward dy_perm");
  const auto& offsets = saved.expert_offsets;
  const Device device = dy_perm.device();
  Tensor dh = Tensor::empty({M, F}, DType::f32, device).set_name("experts.dh");
  Tensor dh3;
  if (gated(config_.activation))
    dh3 = Tensor::empty({M, F}, DType::f32, device).set_name("experts.dh3");
  Tensor dx = Tensor::empty({M, D}, DType::f32, device).set_name("experts.dx_perm");
  if (!store_) {
    ExpertTensors g = resident_gradients();
    backward_group(resident(), g, offsets, config_, dy_perm, saved.x_perm, saved.h, saved.h3,
                   saved.a, dh, dh3, dx);
    return dx;
  }
  MOE_CHECK(!store_->whole_layers(), "experts ", w1_->name,
            ": the expert store serves forward passes only (inference)");
  std::vector<int32_t> rows;
  const std::vector<int32_t> used = experts_with_rows(offsets, rows);
  store_->request(store_layer_, used, rows, Pass::backward);
  for (int32_t e : used) {
    const int32_t r0 = offsets[static_cast<size_t>(e)], r1 = offsets[static_cast<size_t>(e) + 1];
    const ExpertTensors w = store_->acquire(store_layer_, e);
    ExpertTensors g = store_->gradients(store_layer_, e);
    backward_group(w, g, {0, r1 - r0}, config_, dy_perm.rows(r0, r1), saved.x_perm.rows(r0, r1),
                   saved.h.rows(r0, r1), optional(saved.h3, r0, r1), saved.a.rows(r0, r1),
                   dh.rows(r0, r1), optional(dh3, r0, r1), dx.rows(r0, r1));
    store_->release(store_layer_, e);
    store_->gradient_done(store_layer_, e);
  }
  return dx;
}

ExpertTensors ExpertStore::acquire_layer(int layer) {
  throw Error(str("expert store: layer ", layer, " is served one expert at a time, not whole"));
}

void ExpertStore::release_layer(int layer) {
  throw Error(str("expert store: layer ", layer, " is served one expert at a time, not whole"));
}

ExpertTensors Experts::resident() const {
  auto w = [](const Param* p) { return p ? p->w() : Tensor(); };
  return {w(w1_), w(w2_), w(w3_), w(b1_), w(b2_), w(b3_)};
}

ExpertTensors Experts::resident_gradients() const {
  auto g = [](const Param* p) { return p ? p->grad : Tensor(); };
  return {g(w1_), g(w2_), g(w3_), g(b1_), g(b2_), g(b3_)};
}

}  // namespace moe::nn
