#include "moe/optim/adamw.h"

#include <cmath>
#include <map>

#include "kernels/adamw.h"
#include "moe/ops/core.h"
#include "moe/ops/optim.h"

namespace moe::optim {

AdamW::AdamW(ParamSet& params, const AdamWConfig& config, const Filter& holds)
    : params_(params), config_(config) {
  for (Param* p : params.all()) {
    if (p->offloaded) continue;  // its nn::ExpertStore updates it, expert by expert
    if (p->frozen) continue;     // changed by explicit code, never by the optimizer
    if (holds && !holds(*p)) continue;
    Slot s;
    s.param = p;
    s.master = p->value.dtype() == DType::f32 ? p->value : p->value.to(DType::f32);
    // Moments live with the parameter (device parameters keep their optimizer state there).
    s.m = Tensor::zeros(p->value.shape(), DType::f32, p->value.device());
    s.v = Tensor::zeros(p->value.shape(), DType::f32, p->value.device());
    slots_.push_back(std::move(s));
  }
}

kernels::AdamWScalars adamw_scalars(const AdamWConfig& config, float lr, int64_t step, bool decay) {
  return {lr,
          config.beta1,
          config.beta2,
          config.eps,
          decay ? config.weight_decay : 0.0f,
          1.0f - std::pow(config.beta1, static_cast<float>(step)),
          1.0f - std::pow(config.beta2, static_cast<float>(step))};
}

void adamw_update(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                  const kernels::AdamWScalars& scalars, Tensor* value, Tensor* compute) {
  if (value && value->dtype() != DType::f32) {
    ops::adamw_update_rounded(master, m, v, grad, scalars, *value, compute);
    return;
  }
  MOE_CHECK(!compute && (!value || value->raw() == master.raw()),
            "optim::adamw_update: an f32 parameter's master is its storage (", master.describe(),
            "): pass no separate value or compute copy");
  ops::adamw_update(master, m, v, grad, scalars);
}

kernels::AdamWScalars AdamW::scalars(float lr, int64_t step, bool decay) const {
  return adamw_scalars(config_, lr, step, decay);
}

AdamW::ParamState AdamW::state_of(const Param& param) const {
  for (const Slot& s : slots_)
    if (s.param == &param) return {s.master, s.m, s.v};
  throw Error(str("AdamW: parameter '", param.name, "' is not in this optimizer"));
}

namespace {

// Whether the step may write the compute copy itself: Param::refresh_compute would keep this
// buffer (f32, the value's shape and device, not the value itself) and only copy into it.
bool compute_reusable(const Param& p) {
  return p.compute.defined() && p.compute.dtype() == DType::f32 &&
         p.compute.raw() != p.value.raw() && p.compute.shape() == p.value.shape() &&
         p.compute.device() == p.value.device();
}

}  // namespace

void AdamW::step(float lr, const Filter& include) {
  ++t_;
  for (Slot& s : slots_) {
    Param& p = *s.param;
    if (include && !include(p)) continue;
    const kernels::AdamWScalars sc = scalars(lr, t_, p.decay);
    if (s.master.raw() == p.value.raw()) {
      ops::adamw_update(s.master, s.m, s.v, p.grad, sc);
      p.refresh_compute();
    } else if (compute_reusable(p)) {
      ops::adamw_update_rounded(s.master, s.m, s.v, p.grad, sc, p.value, &p.compute);
    } else {
      ops::adamw_update_rounded(s.master, s.m, s.v, p.grad, sc, p.value, nullptr);
      p.refresh_compute();
    }
  }
}

std::vector<OptimizerTensor> AdamW::state() const {
  std::vector<OptimizerTensor> out;
  for (const Slot& s : slots_) {
    out.push_back({"adam.m." + s.param->name, s.m, s.param->expert, s.param});
    out.push_back({"adam.v." + s.param->name, s.v, s.param->expert, s.param});
    if (s.master.raw() != s.param->value.raw())
      out.push_back({"master." + s.param->name, s.master, s.param->expert, s.param});
  }
  return out;
}

void AdamW::load_state(const std::vector<OptimizerTensor>& tensors, int64_t steps_taken) {
  std::map<std::string, const Tensor*> by_name;
  for (const OptimizerTensor& t : tensors) by_name[t.name] = &t.tensor;
  auto restore = [&](const std::string& name, Tensor& into) {
    auto it = by_name.find(name);
    MOE_CHECK(it != by_name.end(), "optimizer state: missing tensor '", name, "'");
    MOE_CHECK(it->second->shape() == into.shape() && it->second->dtype() == DType::f32,
              "optimizer state: ", it->second->describe(), " does not match ", into.describe(),
              " for '", name, "'");
    into.copy_from(*it->second);
  };
  for (Slot& s : slots_) {
    restore("adam.m." + s.param->name, s.m);
    restore("adam.v." + s.param->name, s.v);
    if (s.master.raw() != s.param->value.raw()) restore("master." + s.param->name, s.master);
  }
  t_ = steps_taken;
}

double grad_square_sum(const Param& p) {
  MOE_CHECK(!p.offloaded, "'", p.name, "' is offloaded: its store sums its gradient");
  // Per expert only where a store can hold the experts (the CPU): on a device each sum is a
  // launch and a copy back, and no store adds device sums.
  if (!p.expert || p.grad.ndim() == 0 || p.grad.device().kind != Device::cpu)
    return ops::sum_squares(p.grad);
  double sum = 0;
  for (int64_t e = 0; e < p.grad.dim(0); ++e) sum += ops::sum_squares(p.grad.rows(e, e + 1));
  return sum;
}

double clip_grad_norm(ParamSet& params, double max_norm, const OffloadedSquareSum& offloaded) {
  double sum = 0;
  for (const Param* p : std::as_const(params).all()) {
    if (p->offloaded) {
      MOE_CHECK(offloaded, "'", p->name, "' is offloaded but no store sums its gradient");
      sum += offloaded(*p);
    } else {
      sum += grad_square_sum(*p);
    }
  }
  double norm = std::sqrt(sum);
  clip_gradients(params, max_norm, norm);
  return norm;
}

float clip_scale(double max_norm, double norm) {
  return max_norm > 0 && norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-6)) : 1.0f;
}

void clip_gradients(ParamSet& params, double max_norm, double norm) {
  if (max_norm > 0 && norm > max_norm) {
    const float scale = clip_scale(max_norm, norm);
    for (Param* p : params.all())  // --zero 3 keeps no whole dense gradient: undefined ones
      if (!p->offloaded && p->grad.defined()) ops::scale(p->grad, scale);
  }
}

float lr_at(int64_t step, int64_t total, int64_t warmup, float lr, float min_lr) {
  if (warmup > 0 && step < warmup)
    return lr * static_cast<float>(step + 1) / static_cast<float>(warmup);
  int64_t decay_steps = std::max<int64_t>(1, total - warmup);
  double progress =
      std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(decay_steps));
  double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return static_cast<float>(min_lr + (lr - min_lr) * cosine);
}

}  // namespace moe::optim
