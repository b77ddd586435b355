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
  MOE_USAGE_CHECK(config.first_expert >= 0 && config.first_expert + E <= G, "experts ", prefix,
                  ": experts [", config.first_expert, ", ", config.first_expert + E,
                  ") are not within the layer's ", G);
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
    if (G == E) return &ps.add(prefix + name, global, init, decay, true);
    return &ps.add_shard(prefix + name, ParamShard{global, 0, config.first_expert, E}, init, decay,
                         true);
  };
  w1_ = add(".w1", {F, D}, Init::normal(config.init_std), true);
  w2_ = add(".w2", {D, F}, Init::normal(config.out_init_std), true);
  if (config.activation == Activation::swiglu)
    w3_ = add(".w3", {F, D}, Init::normal(config.init_std), true);
  if (config.bias) {
    b1_ = add(".b1", {F}, Init::zeros(), false);
    b2_ = add(".b2", {D}, Init::zeros(), false);
  }
  if (store) store_layer_ = store->add_layer({w1_, w2_, w3_, b1_, b2_});
}

Tensor Experts::forward(const Tensor& x_perm, const std::vector<int32_t>& expert_offsets,
                        Saved* saved) const {
  const int64_t D = config_.d_model, F = config_.d_ff;
  MOE_CHECK(x_perm.ndim() == 2 && x_perm.dim(1) == D, "experts ", w1_->name, ": input ",
            x_perm.describe(), " expected [M,", D, "]");
  MOE_CHECK(static_cast<int64_t>(expert_offsets.size()) == config_.num_experts + 1, "experts ",
            w1_->name, ": ", expert_offsets.size(), " offsets for ", config_.num_experts,
            " experts");
  if (store_) return forward_stored(x_perm, expert_offsets, saved);
  const int64_t M = x_perm.dim(0);
  const bool swiglu = config_.activation == Activation::swiglu;
  Tensor h = Tensor::empty({M, F}, DType::f32, x_perm.device()).set_name("experts.h");
  ops::grouped_gemm(x_perm, w1_->w(), true, expert_offsets, h);
  Tensor h3;
  if (swiglu) {
    h3 = Tensor::empty({M, F}, DType::f32, x_perm.device()).set_name("experts.h3");
    ops::grouped_gemm(x_perm, w3_->w(), true, expert_offsets, h3);
  }
  Tensor a = Tensor::empty({M, F}, DType::f32, x_perm.device()).set_name("experts.a");
  ops::expert_activation(h, h3, b1_ ? b1_->w() : Tensor(), expert_offsets, config_.activation, a);
  Tensor y = Tensor::empty({M, D}, DType::f32, x_perm.device()).set_name("experts.y_perm");
  ops::grouped_gemm(a, w2_->w(), true, expert_offsets, y);
  if (b2_) ops::grouped_add_bias(y, b2_->w(), expert_offsets);
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
  if (store_) return backward_stored(dy_perm, saved);
  const auto& offsets = saved.expert_offsets;
  const bool swiglu = config_.activation == Activation::swiglu;

  if (b2_) ops::grouped_bias_grad(dy_perm, offsets, b2_->grad);
  ops::grouped_gemm_weight_grad(dy_perm, saved.a, offsets, w2_->grad);
  // dA = dY W2 (reuses no buffer: `a` stays valid for the caller).
  Tensor dh = Tensor::empty({M, F}, DType::f32, dy_perm.device()).set_name("experts.dh");
  ops::grouped_gemm(dy_perm, w2_->w(), false, offsets, dh);
  Tensor dh3;
  if (swiglu) dh3 = Tensor::empty({M, F}, DType::f32, dy_perm.device()).set_name("experts.dh3");
  ops::expert_activation_backward(dh, saved.h, saved.h3, config_.activation, dh, dh3);
  if (b1_) ops::grouped_bias_grad(dh, offsets, b1_->grad);
  ops::grouped_gemm_weight_grad(dh, saved.x_perm, offsets, w1_->grad);
  Tensor dx = Tensor::empty({M, D}, DType::f32, dy_perm.device()).set_name("experts.dx_perm");
  ops::grouped_gemm(dh, w1_->w(), false, offsets, dx);
  if (swiglu) {
    ops::grouped_gemm_weight_grad(dh3, saved.x_perm, offsets, w3_->grad);
    ops::grouped_gemm(dh3, w3_->w(), false, offsets, dx, 1.0f);
  }
  return dx;
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

// One expert at a time through the store: the same ops as the grouped path on each expert's
// rows, with the expert as a group of one (offsets {0, rows}).
Tensor Experts::forward_stored(const Tensor& x_perm, const std::vector<int32_t>& expert_offsets,
                               Saved* saved) const {
  const int64_t D = config_.d_model, F = config_.d_ff, M = x_perm.dim(0);
  const bool swiglu = config_.activation == Activation::swiglu;
  Tensor h = Tensor::empty({M, F}, DType::f32, x_perm.device()).set_name("experts.h");
  Tensor h3;
  if (swiglu) h3 = Tensor::empty({M, F}, DType::f32, x_perm.device()).set_name("experts.h3");
  Tensor a = Tensor::empty({M, F}, DType::f32, x_perm.device()).set_name("experts.a");
  Tensor y = Tensor::empty({M, D}, DType::f32, x_perm.device()).set_name("experts.y_perm");
  std::vector<int32_t> rows;
  const std::vector<int32_t> used = experts_with_rows(expert_offsets, rows);
  store_->request(store_layer_, used, rows, Pass::forward);
  for (int32_t e : used) {
    const int32_t r0 = expert_offsets[static_cast<size_t>(e)],
                  r1 = expert_offsets[static_cast<size_t>(e) + 1];
    const std::vector<int32_t> one{0, r1 - r0};
    const ExpertTensors w = store_->acquire(store_layer_, e);
    const Tensor x_e = x_perm.rows(r0, r1);
    Tensor h_e = h.rows(r0, r1), a_e = a.rows(r0, r1), y_e = y.rows(r0, r1), h3_e;
    ops::grouped_gemm(x_e, w.w1, true, one, h_e);
    if (swiglu) {
      h3_e = h3.rows(r0, r1);
      ops::grouped_gemm(x_e, w.w3, true, one, h3_e);
    }
    ops::expert_activation(h_e, h3_e, w.b1, one, config_.activation, a_e);
    ops::grouped_gemm(a_e, w.w2, true, one, y_e);
    if (w.b2.defined()) ops::grouped_add_bias(y_e, w.b2, one);
    store_->release(store_layer_, e);
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

Tensor Experts::backward_stored(const Tensor& dy_perm, const Saved& saved) {
  const int64_t D = config_.d_model, F = config_.d_ff, M = saved.x_perm.dim(0);
  const auto& offsets = saved.expert_offsets;
  const bool swiglu = config_.activation == Activation::swiglu;
  Tensor dh = Tensor::empty({M, F}, DType::f32, dy_perm.device()).set_name("experts.dh");
  Tensor dh3;
  if (swiglu) dh3 = Tensor::empty({M, F}, DType::f32, dy_perm.device()).set_name("experts.dh3");
  Tensor dx = Tensor::empty({M, D}, DType::f32, dy_perm.device()).set_name("experts.dx_perm");
  std::vector<int32_t> rows;
  const std::vector<int32_t> used = experts_with_rows(offsets, rows);
  store_->request(store_layer_, used, rows, Pass::backward);
  for (int32_t e : used) {
    const int32_t r0 = offsets[static_cast<size_t>(e)], r1 = offsets[static_cast<size_t>(e) + 1];
    const std::vector<int32_t> one{0, r1 - r0};
    const ExpertTensors w = store_->acquire(store_layer_, e);
    ExpertTensors g = store_->gradients(store_layer_, e);
    const Tensor dy_e = dy_perm.rows(r0, r1), x_e = saved.x_perm.rows(r0, r1),
                 a_e = saved.a.rows(r0, r1), h_e = saved.h.rows(r0, r1);
    const Tensor h3_e = swiglu ? saved.h3.rows(r0, r1) : Tensor();
    Tensor dh_e = dh.rows(r0, r1), dx_e = dx.rows(r0, r1), dh3_e;
    if (swiglu) dh3_e = dh3.rows(r0, r1);
    if (g.b2.defined()) ops::grouped_bias_grad(dy_e, one, g.b2);
    ops::grouped_gemm_weight_grad(dy_e, a_e, one, g.w2);
    ops::grouped_gemm(dy_e, w.w2, false, one, dh_e);
    ops::expert_activation_backward(dh_e, h_e, h3_e, config_.activation, dh_e, dh3_e);
    if (g.b1.defined()) ops::grouped_bias_grad(dh_e, one, g.b1);
    ops::grouped_gemm_weight_grad(dh_e, x_e, one, g.w1);
    ops::grouped_gemm(dh_e, w.w1, false, one, dx_e);
    if (swiglu) {
      ops::grouped_gemm_weight_grad(dh3_e, x_e, one, g.w3);
      ops::grouped_gemm(dh3_e, w.w3, false, one, dx_e, 1.0f);
    }
    store_->release(store_layer_, e);
    store_->gradient_done(store_layer_, e);
  }
  return dx;
}

}  // namespace moe::nn
