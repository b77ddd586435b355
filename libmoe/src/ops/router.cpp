// Router ops (softmax or sigmoid scoring) and the shared expert gate's sigmoid: operand checks,
// then Backend::moe for the row loops; the load, the aux/z losses and
// the aux coefficients of the backward are computed here, on the host (device tensors are copied).
// Shapes: N tokens, D model width, E experts, k experts per token. Loss sums run serially in fp64
// in token order.
#include "kernels/router.h"

#include <cmath>
#include <vector>

#include "core/backend.h"
#include "moe/ops/core.h"
#include "moe/ops/moe.h"
#include "moe/step_breakdown.h"

namespace moe::ops {

// The kernels size their group scratch by this bound; the checks below and ModelConfig use it.
static_assert(kMaxRouterGroups == kernels::kMaxRouterGroups);

void router_jitter(const Tensor& x, float jitter, uint64_t key, Tensor& noise, Tensor& routed,
                   int64_t first_row) {
  const PartScope part(StepPart::router);
  const Device device = require_backend("router_jitter", {&x, &noise, &routed});
  x.expect_dtype(DType::f32, "router_jitter x");
  MOE_CHECK(x.ndim() == 2, "router_jitter: 2-D input expected, got ", x.describe());
  noise.expect_shape(x.shape(), "router_jitter noise");
  routed.expect_shape(x.shape(), "router_jitter routed");
  MOE_CHECK(jitter >= 0.0f && jitter < 1.0f, "router_jitter: jitter ", jitter, " outside [0, 1)");
  backend_for(device).moe.router_jitter(x, jitter, key, noise, routed, first_row);
}

void router_jitter_backward(const Tensor& noise, Tensor& dx) {
  const PartScope part(StepPart::router);
  const Device device = require_backend("router_jitter_backward", {&noise, &dx});
  noise.expect_dtype(DType::f32, "router_jitter_backward noise");
  dx.expect_shape(noise.shape(), "router_jitter_backward dx");
  backend_for(device).moe.router_jitter_backward(noise, dx);
}

void router_softmax(const Tensor& logits, Tensor& probs, Tensor& lse) {
  const PartScope part(StepPart::router);
  const Device device = require_backend("router_softmax", {&logits, &probs, &lse});
  logits.expect_dtype(DType::f32, "router_softmax logits");
  MOE_CHECK(logits.ndim() == 2 && logits.dim(1) > 0, "router_softmax: [N,E] logits expected, got ",
            logits.describe());
  int64_t rows = logits.dim(0);
  probs.expect_shape(logits.shape(), "router_softmax probs");
  lse.expect_shape({rows}, "router_softmax lse");
  backend_for(device).moe.router_softmax(logits, probs, lse);
}

void router_topk(const Tensor& probs, int64_t k, bool normalize, Tensor& topk_idx,
                 Tensor& topk_weight, const Tensor& bias, int64_t groups, int64_t group_topk) {
  const PartScope part(StepPart::router);
  const Device device = require_backend("router_topk", {&probs, &topk_idx, &topk_weight});
  probs.expect_dtype(DType::f32, "router_topk probs");
  MOE_CHECK(probs.ndim() == 2, "router_topk: [N,E] probabilities expected, got ", probs.describe());
  int64_t rows = probs.dim(0), experts = probs.dim(1);
  MOE_CHECK(k >= 1 && k <= experts, "router_topk: top_k ", k, " must be in [1, ", experts, "] for ",
            probs.describe());
  topk_idx.expect_shape({rows, k}, "router_topk idx");
  topk_idx.expect_dtype(DType::i32, "router_topk idx");
  topk_weight.expect_shape({rows, k}, "router_topk weight");
  if (bias.defined()) {
    bias.expect_shape({experts}, "router_topk selection bias");
    bias.expect_dtype(DType::f32, "router_topk selection bias");
    require_backend("router_topk", {&probs, &bias});
  }
  MOE_CHECK(groups >= 1 && groups <= kMaxRouterGroups && experts % groups == 0 &&
                (groups == 1 || experts / groups >= 2) && group_topk >= 1 && group_topk <= groups &&
                (groups == 1 || k <= group_topk * (experts / groups)),
            "router_topk: ", groups, " groups (", group_topk, " chosen) cannot hold top_k ", k,
            " of ", experts, " experts (groups must divide them, at most ", kMaxRouterGroups,
            ", two or more experts each)");
  backend_for(device).moe.router_topk(probs, k, normalize, bias, groups, group_topk, topk_idx,
                                      topk_weight);
}

void router_sigmoid(const Tensor& logits, Tensor& scores, Tensor& probs, Tensor& lse) {
  const PartScope part(StepPart::router);
  const Device device = require_backend("router_sigmoid", {&logits, &scores, &probs, &lse});
  logits.expect_dtype(DType::f32, "router_sigmoid logits");
  MOE_CHECK(logits.ndim() == 2 && logits.dim(1) > 0, "router_sigmoid: [N,E] logits expected, got ",
            logits.describe());
  scores.expect_shape(logits.shape(), "router_sigmoid scores");
  probs.expect_shape(logits.shape(), "router_sigmoid probs");
  lse.expect_shape({logits.dim(0)}, "router_sigmoid lse");
  backend_for(device).moe.router_sigmoid(logits, scores, probs, lse);
}

void router_center_weight(const Tensor& w, const Tensor& center, Tensor& out) {
  const PartScope part(StepPart::router);
  const Device device = require_backend("router_center_weight", {&w, &center, &out});
  MOE_CHECK(w.ndim() == 2, "router_center_weight: [E,D] weight expected, got ", w.describe());
  w.expect_dtype(DType::f32, "router_center_weight weight");
  center.expect_shape({w.dim(1)}, "router_center_weight center");
  center.expect_dtype(DType::f32, "router_center_weight center");
  out.expect_shape(w.shape(), "router_center_weight output");
  out.expect_dtype(DType::f32, "router_center_weight output");
  backend_for(device).moe.router_center_weight(w, center, out);
}

void sigmoid(const Tensor& x, Tensor& y) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("sigmoid", {&x, &y});
  x.expect_dtype(DType::f32, "sigmoid input");
  y.expect_shape(x.shape(), "sigmoid output");
  y.expect_dtype(DType::f32, "sigmoid output");
  backend_for(device).moe.sigmoid(x, y);
}

void sigmoid_backward(const Tensor& dy, const Tensor& y, Tensor& dx) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("sigmoid_backward", {&dy, &y, &dx});
  y.expect_dtype(DType::f32, "sigmoid_backward output");
  dy.expect_shape(y.shape(), "sigmoid_backward dy");
  dy.expect_dtype(DType::f32, "sigmoid_backward dy");
  dx.expect_shape(y.shape(), "sigmoid_backward dx");
  dx.expect_dtype(DType::f32, "sigmoid_backward dx");
  backend_for(device).moe.sigmoid_backward(dy, y, dx);
}

std::vector<int64_t> router_load(const Tensor& topk_idx, int64_t num_experts) {
  const PartScope part(StepPart::router);
  [[maybe_unused]] const Device device = require_backend("router_load", {&topk_idx});
  topk_idx.expect_dtype(DType::i32, "router_load idx");
  // Device ids: counted on the host from a copy (N*k ids), exactly as below.
  if (device.kind != Device::cpu) return router_load(topk_idx.to(Device{}), num_experts);
  std::vector<int64_t> load(static_cast<size_t>(num_experts), 0);
  const int32_t* is = topk_idx.data<int32_t>();
  for (int64_t i = 0, n = topk_idx.numel(); i < n; ++i) {
    MOE_CHECK(is[i] >= 0 && is[i] < num_experts, "router_load: expert id ", is[i],
              " out of range [0, ", num_experts, ") at element ", i, " of ", topk_idx.describe());
    ++load[static_cast<size_t>(is[i])];
  }
  return load;
}

double router_aux_loss(const Tensor& probs, const std::vector<int64_t>& load, int64_t load_tokens,
                       int64_t top_k) {
  const PartScope part(StepPart::router);
  [[maybe_unused]] const Device device = require_backend("router_aux_loss", {&probs});
  probs.expect_dtype(DType::f32, "router_aux_loss probs");
  // Device probabilities: the fixed-order fp64 sums run on the host from a copy.
  if (device.kind != Device::cpu)
    return router_aux_loss(probs.to(Device{}), load, load_tokens, top_k);
  MOE_CHECK(probs.ndim() == 2 && probs.dim(1) == static_cast<int64_t>(load.size()),
            "router_aux_loss: ", probs.describe(), " vs load of ", load.size(), " experts");
  int64_t rows = probs.dim(0), experts = probs.dim(1);
  if (rows == 0 || top_k <= 0 || load_tokens <= 0) return 0.0;
  std::vector<double> mean_prob(static_cast<size_t>(experts), 0.0);
  const float* ps = probs.data<float>();
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t e = 0; e < experts; ++e) mean_prob[e] += ps[t * experts + e];
  double aux = 0.0;
  for (int64_t e = 0; e < experts; ++e) {
    double f = static_cast<double>(load[e]) / static_cast<double>(load_tokens * top_k);
    aux += f * mean_prob[e] / static_cast<double>(rows);
  }
  return static_cast<double>(experts) * aux;
}

double router_z_loss(const Tensor& lse) {
  const PartScope part(StepPart::router);
  [[maybe_unused]] const Device device = require_backend("router_z_loss", {&lse});
  lse.expect_dtype(DType::f32, "router_z_loss lse");
  // Device lse: the fixed-order fp64 sum runs on the host from a copy.
  if (device.kind != Device::cpu) return router_z_loss(lse.to(Device{}));
  int64_t rows = lse.numel();
  if (rows == 0) return 0.0;
  const float* zs = lse.data<float>();
  double sum = 0.0;
  for (int64_t t = 0; t < rows; ++t) sum += static_cast<double>(zs[t]) * zs[t];
  return sum / static_cast<double>(rows);
}

namespace {

// Operand checks of both router backwards; returns the device.
Device check_router_backward(const char* op, const Tensor& probs, const Tensor& lse,
                             const Tensor& topk_idx, const Tensor& dtopk_weight,
                             const std::vector<int64_t>& load, Tensor& dlogits) {
  const Device device = require_backend(op, {&probs, &lse, &topk_idx, &dtopk_weight, &dlogits});
  probs.expect_dtype(DType::f32, op);
  MOE_CHECK(probs.ndim() == 2, op, ": [N,E] probabilities expected, got ", probs.describe());
  int64_t rows = probs.dim(0), experts = probs.dim(1);
  MOE_CHECK(topk_idx.ndim() == 2 && topk_idx.dim(0) == rows, op, ": ", topk_idx.describe(),
            " does not match ", probs.describe());
  int64_t k = topk_idx.dim(1);
  topk_idx.expect_dtype(DType::i32, op);
  dtopk_weight.expect_shape({rows, k}, op);
  dtopk_weight.expect_dtype(DType::f32, op);
  lse.expect_shape({rows}, op);
  dlogits.expect_shape({rows, experts}, op);
  MOE_CHECK(static_cast<int64_t>(load.size()) == experts, op, ": load of ", load.size(),
            " experts for ", probs.describe());
  return device;
}

// d aux / d probs[t,e] = E * f_e / N, the same for every token (f_e over load_tokens tokens).
std::vector<float> aux_coefficients(const std::vector<int64_t>& load, int64_t load_tokens,
                                    int64_t k, int64_t rows, float aux_scale) {
  const auto experts = static_cast<int64_t>(load.size());
  std::vector<float> aux_coef(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e)
    aux_coef[e] =
        static_cast<float>(static_cast<double>(aux_scale) * experts * static_cast<double>(load[e]) /
                           (static_cast<double>(load_tokens) * k * rows));
  return aux_coef;
}

}  // namespace

void router_backward(const Tensor& probs, const Tensor& lse, const Tensor& topk_idx,
                     const Tensor& dtopk_weight, bool normalize, const std::vector<int64_t>& load,
                     int64_t load_tokens, float aux_scale, float z_scale, Tensor& dlogits) {
  const PartScope part(StepPart::router);
  const Device device =
      check_router_backward("router_backward", probs, lse, topk_idx, dtopk_weight, load, dlogits);
  const int64_t rows = probs.dim(0);
  if (rows == 0) return;
  const float z_factor = static_cast<float>(2.0 * z_scale / static_cast<double>(rows));
  backend_for(device).moe.router_backward(
      probs, lse, topk_idx, dtopk_weight, normalize,
      aux_coefficients(load, load_tokens, topk_idx.dim(1), rows, aux_scale), z_factor, dlogits);
}

void router_backward_sigmoid(const Tensor& scores, const Tensor& logits, const Tensor& lse,
                             const Tensor& topk_idx, const Tensor& dtopk_weight, bool normalize,
                             const std::vector<int64_t>& load, int64_t load_tokens, float aux_scale,
                             float z_scale, Tensor& dlogits) {
  const PartScope part(StepPart::router);
  const Device device = check_router_backward("router_backward_sigmoid", scores, lse, topk_idx,
                                              dtopk_weight, load, dlogits);
  logits.expect_shape(scores.shape(), "router_backward_sigmoid logits");
  require_backend("router_backward_sigmoid", {&scores, &logits});
  const int64_t rows = scores.dim(0);
  if (rows == 0) return;
  const float z_factor = static_cast<float>(2.0 * z_scale / static_cast<double>(rows));
  backend_for(device).moe.router_backward_sigmoid(
      scores, logits, lse, topk_idx, dtopk_weight, normalize,
      aux_coefficients(load, load_tokens, topk_idx.dim(1), rows, aux_scale), z_factor, dlogits);
}

}  // namespace moe::ops
