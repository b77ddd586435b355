// Router forward/backward (see moe/nn/router.h).
// Shapes: N tokens, D model width, E experts, k experts per token, M kept assignments.
#include "moe/nn/router.h"

#include <algorithm>
#include <cmath>

#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#include "moe/ops/moe.h"
#include "moe/rng.h"

namespace moe::nn {

uint64_t router_jitter_key(const RouterStep& step) {
  return rng_key(step.seed, {hash_name("router.jitter"), static_cast<uint64_t>(step.step),
                             static_cast<uint64_t>(step.layer)});
}

int64_t router_capacity(float capacity_factor, int64_t num_tokens, int64_t top_k,
                        int64_t num_experts) {
  if (capacity_factor <= 0.0f || num_tokens == 0) return 0;
  double c = std::ceil(static_cast<double>(capacity_factor) * static_cast<double>(num_tokens) *
                       static_cast<double>(top_k) / static_cast<double>(num_experts));
  return std::max<int64_t>(1, static_cast<int64_t>(c));
}

Router::Router(ParamSet& ps, const std::string& prefix, const RouterConfig& config)
    : config_(config) {
  MOE_USAGE_CHECK(config.d_model > 0 && config.num_experts > 0, "router ", prefix,
                  ": d_model and num_experts must be positive (got ", config.d_model, ", ",
                  config.num_experts, ")");
  MOE_USAGE_CHECK(config.top_k >= 1 && config.top_k <= config.num_experts, "router ", prefix,
                  ": top_k ", config.top_k, " must be in [1, num_experts = ", config.num_experts,
                  "]");
  MOE_USAGE_CHECK(config.jitter >= 0.0f && config.jitter < 1.0f, "router ", prefix, ": jitter ",
                  config.jitter, " must be in [0, 1)");
  MOE_USAGE_CHECK(config.capacity_factor >= 0.0f, "router ", prefix, ": capacity_factor ",
                  config.capacity_factor, " is negative");
  weight_ = &ps.add(prefix + ".weight", {config.num_experts, config.d_model},
                    Init::normal(config.init_std));
  if (config.selection_bias) {
    // Stored in f32 whatever the model's dtype: each update moves it by the rate (1e-3 to 1e-2),
    // which a 16-bit value near 1 would round away (bf16's spacing there is 2^-7).
    bias_ = &ps.add(prefix + ".bias", {config.num_experts}, Init::zeros(), /*decay=*/false,
                    /*expert=*/false, DType::f32);
    bias_->frozen = true;
  }
  if (config.logit_bias)
    logit_bias_ = &ps.add(prefix + ".logit_bias", {config.num_experts}, Init::zeros(),
                          /*decay=*/false);
  if (config.center) {  // f32 for the same reason: the rate moves it by small steps
    center_ = &ps.add(prefix + ".center", {config.d_model}, Init::zeros(), /*decay=*/false,
                      /*expert=*/false, DType::f32);
    center_->frozen = true;
  }
}

Tensor center_router_weight(const Tensor& m, const Tensor& center) {
  MOE_CHECK(m.ndim() == 2 && center.ndim() == 1 && center.dim(0) == m.dim(1),
            "center_router_weight: weight ", m.describe(), " and center ", center.describe());
  const Tensor c32 = center.to(Device{}).to(DType::f32);
  if (ops::sum_squares(c32) == 0) return m;  // zero iff every element is (squares in double)
  const Tensor w32 = m.to(Device{}).to(DType::f32);
  Tensor w = Tensor::empty(w32.shape());
  ops::router_center_weight(w32, c32, w);
  return w.to(m.dtype());
}

namespace {
// W' on W's device: an f32 weight on a GPU is centred there (no host round trip); a host weight,
// or a 16-bit compute copy, by center_router_weight (returns W itself while c = 0).
Tensor centred_on_device(const Tensor& w, const Tensor& center) {
  if (w.device().kind == Device::cpu || w.dtype() != DType::f32) {
    const Tensor r = center_router_weight(w, center);
    return r.raw() == w.raw() ? r : r.to(w.device());
  }
  Tensor out = Tensor::empty(w.shape(), DType::f32, w.device()).set_name("router.centred_weight");
  ops::router_center_weight(w, center.to(w.device()), out);
  return out;
}

// Changes a small f32 parameter (a center, a selection bias) on the host: fn edits a host copy of
// its values, which then goes back to the parameter's device.
template <class Fn>
void edit_on_host(Param& p, Fn&& fn) {
  Tensor host = p.w().to(Device{}).clone();
  fn(host.data<float>());
  p.value.copy_from(host.to(p.value.device()));
  p.refresh_compute();
}
}  // namespace

void update_router_center(Param& center, const std::vector<double>& input_sum, int64_t tokens,
                          double rate) {
  const int64_t d = center.numel();
  MOE_CHECK(static_cast<int64_t>(input_sum.size()) == d && tokens > 0 && center.value.defined(),
            "router center '", center.name, "' of ", d, " features updated with a sum of ",
            input_sum.size(), " over ", tokens, " tokens");
  edit_on_host(center, [&](float* cs) {
    bool zero = true;
    for (int64_t i = 0; i < d; ++i) zero = zero && cs[i] == 0.0f;
    const double r = zero ? 1.0 : rate;
    for (int64_t i = 0; i < d; ++i) {
      const double mean = input_sum[static_cast<size_t>(i)] / static_cast<double>(tokens);
      cs[i] = static_cast<float>(cs[i] + r * (mean - cs[i]));
    }
  });
}

void update_selection_bias(Param& bias, const std::vector<int64_t>& load, double rate) {
  const auto experts = static_cast<int64_t>(load.size());
  MOE_CHECK(bias.numel() == experts && bias.value.defined(), "selection bias '", bias.name, "' of ",
            bias.numel(), " experts updated with a load of ", experts);
  int64_t total = 0;
  for (int64_t l : load) total += l;
  const float step = static_cast<float>(rate);
  edit_on_host(bias, [&](float* bs) {
    for (int64_t e = 0; e < experts; ++e) {
      // sign(mean - load_e) = sign(total - E load_e), exact in integers.
      const int64_t diff = total - experts * load[static_cast<size_t>(e)];
      if (diff > 0) bs[e] += step;
      if (diff < 0) bs[e] -= step;
    }
  });
}

Tensor Router::effective_weight() const {
  if (!center_) return weight_->w();
  return centred_on_device(weight_->w(), center_->w());
}

Tensor Router::choose(const Tensor& x, int64_t k) const {
  MOE_CHECK(x.ndim() == 2 && x.dim(1) == config_.d_model, "router ", weight_->name, ": input ",
            x.describe(), " expected [N,", config_.d_model, "]");
  x.expect_dtype(DType::f32, "router input");
  const int64_t tokens = x.dim(0), experts = config_.num_experts;
  const int64_t room =
      config_.groups > 1 ? config_.group_topk * (experts / config_.groups) : experts;
  k = std::clamp<int64_t>(k, config_.top_k, room);
  // The logits and scores as forward makes them (the same grouped GEMM, so the same bits).
  Tensor logits = Tensor::empty({tokens, experts}, DType::f32, x.device());
  const std::vector<int32_t> all_tokens{0, static_cast<int32_t>(tokens)};
  ops::grouped_gemm(x, effective_weight().reshape({1, experts, config_.d_model}), true, all_tokens,
                    logits);
  if (logit_bias_) ops::bias_add(logits, logit_bias_->w());
  Tensor scores = Tensor::empty({tokens, experts}, DType::f32, x.device());
  Tensor probs = Tensor::empty({tokens, experts}, DType::f32, x.device());
  Tensor lse = Tensor::empty({tokens}, DType::f32, x.device());
  if (config_.scoring == RouterScoring::sigmoid)
    ops::router_sigmoid(logits, scores, probs, lse);
  else
    ops::router_softmax(logits, scores, lse);
  Tensor idx = Tensor::empty({tokens, k}, DType::i32, x.device());
  Tensor weight = Tensor::empty({tokens, k}, DType::f32, x.device());
  ops::router_topk(scores, k, false, idx, weight, bias_ ? bias_->w() : Tensor(), config_.groups,
                   config_.group_topk);
  return idx;
}

RouterOutput Router::forward(const Tensor& x, const RouterStep& step) const {
  MOE_CHECK(x.ndim() == 2 && x.dim(1) == config_.d_model, "router ", weight_->name, ": input ",
            x.describe(), " expected [N,", config_.d_model, "]");
  x.expect_dtype(DType::f32, "router input");
  const int64_t tokens = x.dim(0), experts = config_.num_experts, k = config_.top_k;
  RouterOutput out;
  if (step.training && config_.jitter > 0.0f) {
    out.jitter_noise =
        Tensor::empty(x.shape(), DType::f32, x.device()).set_name("router.jitter_noise");
    out.routed_input =
        Tensor::empty(x.shape(), DType::f32, x.device()).set_name("router.routed_input");
    ops::router_jitter(x, config_.jitter, router_jitter_key(step), out.jitter_noise,
                       out.routed_input, step.first_token);
  } else {
    out.routed_input = x;
  }
  out.logits = Tensor::empty({tokens, experts}, DType::f32, x.device()).set_name("router.logits");
  // logits = routed_input Wg^T, as a grouped GEMM of one group: its sum over D is cut at fixed
  // places, so the logits (and the routing) do not depend on the thread count.
  const std::vector<int32_t> all_tokens{0, static_cast<int32_t>(tokens)};
  out.weight = effective_weight();
  out.centred = center_ && out.weight.raw() != weight_->w().raw();
  ops::grouped_gemm(out.routed_input, out.weight.reshape({1, experts, config_.d_model}), true,
                    all_tokens, out.logits);
  if (logit_bias_) ops::bias_add(out.logits, logit_bias_->w());
  out.probs = Tensor::empty({tokens, experts}, DType::f32, x.device()).set_name("router.probs");
  out.lse = Tensor::empty({tokens}, DType::f32, x.device()).set_name("router.lse");
  if (config_.scoring == RouterScoring::sigmoid) {
    out.scores = Tensor::empty({tokens, experts}, DType::f32, x.device()).set_name("router.scores");
    ops::router_sigmoid(out.logits, out.scores, out.probs, out.lse);
  } else {
    ops::router_softmax(out.logits, out.probs, out.lse);
    out.scores = out.probs;
  }
  out.topk_idx = Tensor::empty({tokens, k}, DType::i32, x.device()).set_name("router.topk_idx");
  out.topk_weight =
      Tensor::empty({tokens, k}, DType::f32, x.device()).set_name("router.topk_weight");
  ops::router_topk(out.scores, k, config_.normalize_topk, out.topk_idx, out.topk_weight,
                   bias_ ? bias_->w() : Tensor(), config_.groups, config_.group_topk);
  if (config_.gate_scale != 1.0f) ops::scale(out.topk_weight, config_.gate_scale);
  // The plan counts each expert's assignments while it sorts them (one pass over the ids, one
  // copy of them to the host on a GPU); the aux loss takes its load from there.
  out.plan = make_plan(out.topk_idx, out.topk_weight, experts,
                       router_capacity(config_.capacity_factor, tokens, k, experts));
  out.load = out.plan.load;
  out.load_tokens = tokens;
  out.aux_loss = ops::router_aux_loss(out.probs, out.load, out.load_tokens, k);
  out.z_loss = ops::router_z_loss(out.lse);
  return out;
}

Tensor Router::backward(const Tensor& dweight_of_slot, const RouterOutput& out, const Tensor& x,
                        float aux_scale, float z_scale) {
  const int64_t tokens = out.probs.dim(0), experts = config_.num_experts, k = config_.top_k;
  x.expect_shape({tokens, config_.d_model}, "router backward x");
  dweight_of_slot.expect_shape({out.plan.num_slots()}, "router backward dweight_of_slot");
  Tensor dtopk =
      Tensor::empty({tokens, k}, DType::f32, out.probs.device()).set_name("router.dtopk_weight");
  ops::slot_to_choice(dweight_of_slot, out.plan.slot_of, dtopk);
  // d loss / d (the weight before gate_scale)
  if (config_.gate_scale != 1.0f) ops::scale(dtopk, config_.gate_scale);
  Tensor dlogits =
      Tensor::empty({tokens, experts}, DType::f32, out.probs.device()).set_name("router.dlogits");
  if (config_.scoring == RouterScoring::sigmoid)
    ops::router_backward_sigmoid(out.scores, out.logits, out.lse, out.topk_idx, dtopk,
                                 config_.normalize_topk, out.load, out.load_tokens, aux_scale,
                                 z_scale, dlogits);
  else
    ops::router_backward(out.probs, out.lse, out.topk_idx, dtopk, config_.normalize_topk, out.load,
                         out.load_tokens, aux_scale, z_scale, dlogits);
  // d logit bias += the column sums of dlogits (rows in order).
  if (logit_bias_) ops::bias_grad(dlogits, logit_bias_->grad);
  // dWg += dlogits^T routed_input and dx = dlogits Wg, through the grouped GEMMs of one group (a
  // sum over tokens and one over experts, both cut at fixed places: thread-count independent).
  const std::vector<int32_t> all_tokens{0, static_cast<int32_t>(tokens)};
  const bool centred = out.centred;
  Tensor dweight = weight_->grad.reshape({1, experts, config_.d_model});
  if (centred) {  // dW += the projection of dW' (W' is linear in W: the same map)
    Tensor dw = Tensor::zeros({1, experts, config_.d_model}, DType::f32, out.probs.device());
    ops::grouped_gemm_weight_grad(dlogits, out.routed_input, all_tokens, dw);
    const Tensor projected =
        centred_on_device(dw.reshape({experts, config_.d_model}), center_->w());
    ops::axpy(1.0f, projected.reshape(dweight.shape()), dweight);
  } else {
    ops::grouped_gemm_weight_grad(dlogits, out.routed_input, all_tokens, dweight);
  }
  Tensor dx = Tensor::empty({tokens, config_.d_model}, DType::f32, out.probs.device())
                  .set_name("router.dx");
  ops::grouped_gemm(dlogits,
                    (centred ? out.weight : weight_->w()).reshape({1, experts, config_.d_model}),
                    false, all_tokens, dx);
  if (out.jitter_noise.defined()) ops::router_jitter_backward(out.jitter_noise, dx);
  return dx;
}

}  // namespace moe::nn
