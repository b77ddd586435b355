// Experts forward/backward as grouped GEMMs (see moe/nn/experts.h).
// Shapes: M rows of the permuted buffer, D model width, F expert hidden width, E experts.
#include "moe/nn/experts.h"

#include "moe/ops/moe.h"

namespace moe::nn {

Experts::Experts(ParamSet& ps, const std::string& prefix, const ExpertsConfig& config)
    : config_(config) {
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

}  // namespace moe::nn
