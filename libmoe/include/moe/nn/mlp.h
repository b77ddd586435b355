// Dense feed-forward block. Shape letters: N tokens, D model width, F hidden width.
// gelu:   y = W2 gelu(W1 x + b1) + b2; params prefix.w1 [F,D], prefix.b1 [F], prefix.w2 [D,F],
//         prefix.b2 [D] (biases only when bias).
// swiglu: y = W2 (silu(W1 x) * W3 x); params prefix.w1 [F,D] (gate), prefix.w3 [F,D] (up),
//         prefix.w2 [D,F] (and prefix.b1 [F], prefix.b3 [F], prefix.b2 [D] when bias; mixtral
//         has none).
#pragma once
#include <memory>
#include <string>

#include "moe/nn/common.h"
#include "moe/nn/linear.h"
#include "moe/param.h"

namespace moe::nn {

struct MlpConfig {
  int64_t d_model = 0, d_ff = 0;
  Activation activation = Activation::gelu;
  bool bias = true;
  float init_std = 0.02f, out_init_std = 0.02f;  // out_init_std: w2
};

class MLP {
 public:
  MLP(ParamSet& ps, const std::string& prefix, const MlpConfig& config);

  struct Saved {
    Tensor x;       // [N,D] input
    Tensor pre;     // [N,F] W1 x (+ b1): the gelu input / the swiglu gate
    Tensor up;      // [N,F] W3 x (swiglu only)
    Tensor hidden;  // [N,F] activation output, input of W2
  };
  // x [N,D] -> [N,D]; saved == nullptr for inference.
  Tensor forward(const Tensor& x, Saved* saved) const;
  // Returns dx; accumulates parameter gradients.
  Tensor backward(const Tensor& dy, const Saved& saved);

  const MlpConfig& config() const { return config_; }

 private:
  MlpConfig config_;
  Linear w1_, w2_;
  std::unique_ptr<Linear> w3_;  // swiglu only
};

}  // namespace moe::nn
