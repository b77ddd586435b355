// Fully connected layer: y[N,out] = x[N,in] W^T + b, W stored [out, in] (PyTorch / HF layout).
// Shape letters: N tokens.
#pragma once
#include <string>

#include "moe/param.h"

namespace moe::nn {

// Explicit parameter names (e.g. "mlp.w1" / "mlp.b1"); an empty bias name means no bias.
struct LinearNames {
  std::string weight, bias;
};

class Linear {
 public:
  // Params prefix+".weight" [out,in] (normal(init_std), decay) and, when bias, prefix+".bias"
  // [out] (zeros, no decay).
  Linear(ParamSet& ps, const std::string& prefix, int64_t in, int64_t out, bool bias,
         float init_std);
  Linear(ParamSet& ps, const LinearNames& names, int64_t in, int64_t out, float init_std);

  Tensor forward(const Tensor& x) const;
  // Returns dx [N,in]; accumulates weight (and bias) gradients.
  Tensor backward(const Tensor& dy, const Tensor& x);
  // As backward, writing dx (accumulate = false) or adding to it (accumulate = true).
  void backward_into(const Tensor& dy, const Tensor& x, Tensor& dx, bool accumulate);

  Param& weight() const { return *weight_; }
  Param* bias() const { return bias_; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  void check_input(const Tensor& x) const;
  std::string name_;
  int64_t in_, out_;
  Param* weight_;
  Param* bias_ = nullptr;
};

}  // namespace moe::nn
