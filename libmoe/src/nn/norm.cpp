// LayerNorm / RMSNorm layer. Shape letters: N tokens, D features.
#include "moe/nn/norm.h"

#include "moe/ops/dense.h"

namespace moe::nn {

Norm::Norm(ParamSet& ps, const std::string& prefix, int64_t dim, NormKind kind, float eps)
    : prefix_(prefix), dim_(dim), kind_(kind), eps_(eps) {
  MOE_USAGE_CHECK(dim > 0 && eps >= 0.0f, "norm ", prefix, ": dim ", dim, ", eps ", eps);
  weight_ = &ps.add(prefix + ".weight", {dim}, Init::ones(), /*decay=*/false);
  if (kind == NormKind::layernorm)
    bias_ = &ps.add(prefix + ".bias", {dim}, Init::zeros(), /*decay=*/false);
}

Tensor Norm::forward(const Tensor& x, Saved* saved) const {
  MOE_CHECK(x.ndim() == 2 && x.dim(1) == dim_, "norm ", prefix_, ": input ", x.describe(),
            " expected [N,", dim_, "]");
  const int64_t n = x.dim(0);
  Tensor y = Tensor::empty({n, dim_}, DType::f32, x.device());
  Tensor rstd = saved ? Tensor::empty({n}, DType::f32, x.device()) : Tensor();
  if (kind_ == NormKind::layernorm) {
    Tensor mean = saved ? Tensor::empty({n}, DType::f32, x.device()) : Tensor();
    ops::layernorm_forward(x, weight_->w(), bias_->w(), eps_, y, saved ? &mean : nullptr,
                           saved ? &rstd : nullptr);
    if (saved) saved->mean = mean;
  } else {
    ops::rmsnorm_forward(x, weight_->w(), eps_, y, saved ? &rstd : nullptr);
    if (saved) saved->mean = Tensor();
  }
  if (saved) {
    saved->x = x;
    saved->rstd = rstd;
  }
  return y;
}

Tensor Norm::backward(const Tensor& dy, const Saved& saved) {
  MOE_CHECK(saved.x.defined() && saved.rstd.defined(), "norm ", prefix_,
            ": backward without a saved forward");
  Tensor dx = Tensor::empty(saved.x.shape(), DType::f32, saved.x.device());
  if (kind_ == NormKind::layernorm)
    ops::layernorm_backward(dy, saved.x, weight_->w(), saved.mean, saved.rstd, dx, weight_->grad,
                            &bias_->grad);
  else
    ops::rmsnorm_backward(dy, saved.x, weight_->w(), saved.rstd, dx, weight_->grad);
  return dx;
}

}  // namespace moe::nn
