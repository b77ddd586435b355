// Linear layer: y[N,out] = x[N,in] W^T + b. Shape letters: N tokens.
// Gradients: dW += dy^T x (GEMM: BLAS splits output blocks, never the token reduction, so the
// sum over tokens does not depend on the thread count), db += column sums of dy, dx = dy W.
#include "moe/nn/linear.h"

#include "moe/ops/core.h"
#include "moe/ops/dense.h"

namespace moe::nn {

Linear::Linear(ParamSet& ps, const std::string& prefix, int64_t in, int64_t out, bool bias,
               float init_std)
    : Linear(ps, LinearNames{prefix + ".weight", bias ? prefix + ".bias" : std::string()}, in, out,
             init_std) {}

Linear::Linear(ParamSet& ps, const LinearNames& names, int64_t in, int64_t out, float init_std)
    : name_(names.weight), in_(in), out_(out) {
  MOE_USAGE_CHECK(in > 0 && out > 0, "linear ", names.weight, ": in ", in, " and out ", out,
                  " must be positive");
  weight_ = &ps.add(names.weight, {out, in}, Init::normal(init_std), /*decay=*/true);
  if (!names.bias.empty()) bias_ = &ps.add(names.bias, {out}, Init::zeros(), /*decay=*/false);
}

void Linear::check_input(const Tensor& x) const {
  MOE_CHECK(x.ndim() == 2 && x.dim(1) == in_, "linear ", name_, ": input ", x.describe(),
            " expected [N,", in_, "]");
  x.expect_dtype(DType::f32, "linear input");
}

Tensor Linear::forward(const Tensor& x) const {
  check_input(x);
  Tensor y = Tensor::empty({x.dim(0), out_}, DType::f32, x.device());
  ops::gemm(x, false, weight_->w(), true, y);
  if (bias_) ops::bias_add(y, bias_->w());
  return y;
}

Tensor Linear::backward(const Tensor& dy, const Tensor& x) {
  Tensor dx = Tensor::empty({x.ndim() == 2 ? x.dim(0) : 0, in_}, DType::f32, x.device());
  backward_into(dy, x, dx, false);
  return dx;
}

void Linear::backward_into(const Tensor& dy, const Tensor& x, Tensor& dx, bool accumulate) {
  check_input(x);
  const int64_t n = x.dim(0);
  MOE_CHECK(dy.ndim() == 2 && dy.dim(0) == n && dy.dim(1) == out_, "linear ", name_, ": gradient ",
            dy.describe(), " expected [", n, ",", out_, "]");
  dy.expect_dtype(DType::f32, "linear gradient");
  dx.expect_shape({n, in_}, "linear dx");
  ops::gemm(dy, true, x, false, weight_->grad, 1.0f, 1.0f);
  if (bias_) ops::bias_grad(dy, bias_->grad);
  ops::gemm(dy, false, weight_->w(), false, dx, 1.0f, accumulate ? 1.0f : 0.0f);
}

}  // namespace moe::nn
