// Test helpers: seeded random tensors and finite-difference gradient checks.
#pragma once
#include <functional>
#include <string>

#include "moe/param.h"
#include "moe/tensor.h"

namespace moe::test {

// Fresh values from a fixed seed, normal(0, scale); never all zero.
Tensor random_tensor(Shape shape, uint64_t seed, float scale = 1.0f);
// Random int32 ids in [0, limit).
Tensor random_ids(Shape shape, uint64_t seed, int32_t limit);

// Overwrites a parameter with fresh normal(0, scale) values and refreshes its compute copy.
void randomize_param(Param& p, uint64_t seed, float scale);
// MoE layer weights at scales that keep activations O(1) and the router's top-k choices well
// separated (so finite differences do not flip a choice): router 3/sqrt(D), w2 1/sqrt(F), other
// matrices 1/sqrt(D), everything else (biases) `other_scale`.
void randomize_moe_params(ParamSet& ps, int64_t d_model, int64_t d_ff, float other_scale,
                          uint64_t salt);

// sum_i y_i * r_i in double: a scalar loss whose gradient w.r.t. y is r.
double dot(const Tensor& y, const Tensor& r);

struct GradCheckResult {
  double max_error = 0;   // max |analytic - numeric| / max |numeric| over checked elements
  double grad_scale = 0;  // max |numeric|: a check on an all-zero gradient proves nothing
  int checked = 0;
  std::string worst;  // "element i: analytic a numeric n"
};

// Central differences of `loss` w.r.t. up to `max_checks` elements of `x` (spread over the tensor,
// always including the first and last), compared with `analytic` (same shape as x).
// `x` must be an fp32 tensor that `loss` reads.
GradCheckResult check_gradient(Tensor& x, const Tensor& analytic,
                               const std::function<double()>& loss, double eps = 1e-2,
                               int max_checks = 48);

}  // namespace moe::test

// REQUIRE that a gradient check passed with the given tolerance and a non-trivial gradient.
#define MOE_REQUIRE_GRAD(result, tol)                                                         \
  do {                                                                                        \
    auto _r = (result);                                                                       \
    INFO("gradcheck: max_error " << _r.max_error << " scale " << _r.grad_scale << " checked " \
                                 << _r.checked << " worst " << _r.worst);                     \
    REQUIRE(_r.checked > 0);                                                                  \
    REQUIRE(_r.grad_scale > 1e-6);                                                            \
    REQUIRE(_r.max_error < (tol));                                                            \
  } while (0)
