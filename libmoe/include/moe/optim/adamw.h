// AdamW with fp32 master weights and moments, whatever dtype the parameters are stored in.
//
// Step counter and expert-wise updates: step(lr) advances steps_taken() from t - 1 to t and runs
// update number t (bias corrections 1 - beta^t) on every parameter it includes. An expert-wise
// optimizer updates expert slices itself with optim::adamw_update and the scalars of the same
// update: scalars(lr, t, decay), i.e. t = steps_taken() after that iteration's step() (or
// steps_taken() + 1 before it), and keeps those parameters out of step() with its filter. Slices
// in any order, on any thread, give bitwise the values a whole-tensor step gives.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "moe/param.h"

namespace moe::kernels {
struct AdamWScalars;  // kernels/adamw.h: lr, betas, eps, weight decay, bias corrections
}  // namespace moe::kernels

namespace moe::optim {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to parameters with Param::decay
};

struct OptimizerTensor {  // for checkpoints: "adam.m.<param>", "adam.v.<param>", "master.<param>"
  std::string name;
  Tensor tensor;
  bool expert = false;
  const Param* param = nullptr;  // the parameter it belongs to (set by state())
};

// The scalars of update number `step` (1-based) with learning rate lr, for a parameter with
// weight decay on (Param::decay) or off.
kernels::AdamWScalars adamw_scalars(const AdamWConfig& config, float lr, int64_t step, bool decay);

// One AdamW update of master, m and v (f32) with grad (f32), all the same element count: a whole
// parameter's state or views of one contiguous range of it (Tensor::rows of an [E, F, D]
// parameter: one expert). For a bf16/f16 parameter, `value` (its storage, the same range)
// receives the rounded master and `compute` (not null) the fp32 upcast, in the same pass; for an
// f32 parameter leave both null (the master is the storage). Bitwise what AdamW::step writes.
void adamw_update(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                  const kernels::AdamWScalars& scalars, Tensor* value = nullptr,
                  Tensor* compute = nullptr);

class AdamW {
 public:
  // Which parameters a step updates (null: all).
  using Filter = std::function<bool(const Param&)>;

  // `holds` (null: all) says which parameters get state here at all: the others (dense
  // parameters whose state ZeRO shards, parallel::DenseShards) are neither stepped nor saved.
  AdamW(ParamSet& params, const AdamWConfig& config, const Filter& holds = nullptr);
  // One update with learning rate lr from the gradients in the ParamSet; writes the rounded master
  // into each parameter's storage and refreshes its compute copy (bf16/f16: in the same pass on
  // the CPU). Parameters `include` rejects keep their values and state; the counter advances.
  void step(float lr, const Filter& include = nullptr);
  int64_t steps_taken() const { return t_; }
  const AdamWConfig& config() const { return config_; }
  kernels::AdamWScalars scalars(float lr, int64_t step, bool decay) const;

  // One parameter's optimizer state (sharing storage; master is the value itself for f32), for
  // updates of its slices; throws naming a parameter this optimizer does not hold.
  struct ParamState {
    Tensor master, m, v;
  };
  ParamState state_of(const Param& param) const;

  std::vector<OptimizerTensor> state() const;  // shares storage with the optimizer
  // Restores moments (and masters for bf16/f16 parameters); throws naming a missing/mis-shaped
  // tensor.
  void load_state(const std::vector<OptimizerTensor>& tensors, int64_t steps_taken);

 private:
  struct Slot {
    Param* param;
    Tensor master, m, v;  // master aliases param->value when the parameter is fp32
  };
  [[maybe_unused]] ParamSet& params_;  // the slots point into it (never read directly)
  AdamWConfig config_;
  std::vector<Slot> slots_;
  int64_t t_ = 0;
};

// One parameter's share of the squared global gradient norm: an expert parameter's experts are
// summed one at a time, in order (each expert's sum from zero), so that an nn::ExpertStore that
// finishes experts one by one adds exactly the same doubles; other parameters, and device
// gradients (no store holds device experts; each sum there is a launch), whole.
double grad_square_sum(const Param& p);
// The share of a Param::offloaded parameter, from the store that holds it.
using OffloadedSquareSum = std::function<double(const Param&)>;

// Scales all gradients so their global L2 norm is at most max_norm (no-op when max_norm <= 0).
// Returns the norm before clipping. The sum runs in a fixed order: thread-count independent.
// Offloaded parameters count through `offloaded` (required when there are any) and are not
// scaled here: their store applies clip_scale().
double clip_grad_norm(ParamSet& params, double max_norm, const OffloadedSquareSum& offloaded = {});
// The factor clipping multiplies every gradient by (1 when the norm is within max_norm).
float clip_scale(double max_norm, double norm);
// The scaling step of clip_grad_norm for a norm computed elsewhere (e.g. summed over ranks that
// hold different parameters): scales every gradient by max_norm / norm when norm > max_norm > 0.
void clip_gradients(ParamSet& params, double max_norm, double norm);

// Linear warmup to lr over `warmup` steps, then cosine decay to min_lr at `total` steps.
float lr_at(int64_t step, int64_t total, int64_t warmup, float lr, float min_lr);

}  // namespace moe::optim
