// LayerNorm (prefix.weight ones, prefix.bias zeros) or RMSNorm (prefix.weight only) over the
// last dimension, fp32. No weight decay. Shape letters: N tokens, D features.
#pragma once
#include <string>

#include "moe/nn/common.h"
#include "moe/param.h"

namespace moe::nn {

class Norm {
 public:
  Norm(ParamSet& ps, const std::string& prefix, int64_t dim, NormKind kind, float eps);

  struct Saved {
    Tensor x, mean, rstd;  // x [N,D], mean [N] (LayerNorm only), rstd [N]
  };
  // x [N,D] -> [N,D]; saved == nullptr for inference.
  Tensor forward(const Tensor& x, Saved* saved) const;
  // Returns dx; accumulates weight (and bias) gradients.
  Tensor backward(const Tensor& dy, const Saved& saved);

  NormKind kind() const { return kind_; }
  float eps() const { return eps_; }
  Param& weight() const { return *weight_; }
  Param* bias() const { return bias_; }

 private:
  std::string prefix_;
  int64_t dim_;
  NormKind kind_;
  float eps_;
  Param* weight_;
  Param* bias_ = nullptr;
};

}  // namespace moe::nn
