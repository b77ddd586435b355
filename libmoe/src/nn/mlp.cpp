// Dense feed-forward layer (gelu or swiglu). Shape letters: N tokens, D model width, F hidden.
#include "moe/nn/mlp.h"

#include "moe/ops/dense.h"

namespace moe::nn {

namespace {

const MlpConfig& checked(const std::string& prefix, const MlpConfig& c) {
  MOE_USAGE_CHECK(c.d_model > 0 && c.d_ff > 0, "mlp ", prefix, ": d_model ", c.d_model,
                  " and d_ff ", c.d_ff, " must be positive");
  MOE_USAGE_CHECK(c.activation != Activation::swiglu_clamped, "mlp ", prefix,
                  ": a dense MLP takes gelu or swiglu; the clamped SwiGLU (gpt-oss) is an expert "
                  "activation only");
  return c;
}

std::string bias_name(const std::string& prefix, const MlpConfig& c, const char* suffix) {
  return c.bias ? prefix + suffix : std::string();
}

}  // namespace

MLP::MLP(ParamSet& ps, const std::string& prefix, const MlpConfig& config)
    : config_(checked(prefix, config)),
      w1_(ps, LinearNames{prefix + ".w1", bias_name(prefix, config, ".b1")}, config.d_model,
          config.d_ff, config.init_std),
      w2_(ps, LinearNames{prefix + ".w2", bias_name(prefix, config, ".b2")}, config.d_ff,
          config.d_model, config.out_init_std) {
  if (config.activation == Activation::swiglu)
    w3_ =
        std::make_unique<Linear>(ps, LinearNames{prefix + ".w3", bias_name(prefix, config, ".b3")},
                                 config.d_model, config.d_ff, config.init_std);
}

Tensor MLP::forward(const Tensor& x, Saved* saved) const {
  Tensor pre = w1_.forward(x);
  Tensor hidden = Tensor::empty(pre.shape(), DType::f32, pre.device());
  Tensor up;
  if (w3_) {
    up = w3_->forward(x);
    ops::swiglu_forward(pre, up, hidden);
  } else {
    ops::gelu_forward(pre, hidden);
  }
  Tensor y = w2_.forward(hidden);
  if (saved) {
    saved->x = x;
    saved->pre = pre;
    saved->up = up;
    saved->hidden = hidden;
  }
  return y;
}

Tensor MLP::backward(const Tensor& dy, const Saved& saved) {
  MOE_CHECK(saved.x.defined() && saved.pre.defined() && saved.hidden.defined(), "mlp ",
            w1_.weight().name, ": backward without a saved forward");
  Tensor dhidden = w2_.backward(dy, saved.hidden);
  Tensor dx = Tensor::empty(saved.x.shape(), DType::f32, saved.x.device());
  if (w3_) {
    Tensor dup = Tensor::empty(saved.up.shape(), DType::f32, saved.x.device());
    ops::swiglu_backward(dhidden, saved.pre, saved.up, dhidden, dup);  // dgate in place
    w1_.backward_into(dhidden, saved.x, dx, false);
    w3_->backward_into(dup, saved.x, dx, true);
  } else {
    ops::gelu_backward(dhidden, saved.pre, dhidden);
    w1_.backward_into(dhidden, saved.x, dx, false);
  }
  return dx;
}

}  // namespace moe::nn
