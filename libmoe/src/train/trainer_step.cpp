// Trainer::step: the plain step (batch -> passes -> reduce -> clip -> update) in named phases,
// and the optional features as hooks around them (step_hooks.h).
#include <algorithm>
#include <cmath>
#include <optional>

#include "moe/cuda.h"
#include "moe/io/finite.h"
#include "moe/nn/router.h"
#include "moe/settings.h"
#include "moe/timer.h"
#include "moe/train/trainer.h"
#include "train/step_hooks.h"

namespace moe::train {

namespace {

// Adds micro-batch `f` of a step's `micro` to the step's statistics: losses weighted 1/micro
// (a mean over equal micro-batches), counts summed, routing concatenated in token order.
void accumulate_moe(std::vector<nn::MoEStats>& step, std::vector<nn::MoEStats>& f, int64_t index,
                    double weight) {
  MOE_CHECK(step.size() == f.size(), "micro-batch ", index, ": ", f.size(),
            " MoE layers, the step's first had ", step.size());
  for (size_t i = 0; i < step.size(); ++i) {
    nn::MoEStats &into = step[i], &m = f[i];
    into.aux_loss += weight * m.aux_loss;
    into.z_loss += weight * m.z_loss;
    for (size_t e = 0; e < into.load.size() && e < m.load.size(); ++e) into.load[e] += m.load[e];
    for (size_t e = 0; e < into.tokens_per_expert.size() && e < m.tokens_per_expert.size(); ++e)
      into.tokens_per_expert[e] += m.tokens_per_expert[e];
    into.assignments += m.assignments;
    into.dropped += m.dropped;
    into.rows_computed += m.rows_computed;
    for (size_t i = 0; i < into.input_sum.size() && i < m.input_sum.size(); ++i)
      into.input_sum[i] += m.input_sum[i];
    into.input_tokens += m.input_tokens;
    into.choices.insert(into.choices.end(), m.choices.begin(), m.choices.end());
    into.gates.insert(into.gates.end(), m.gates.begin(), m.gates.end());
  }
}

void accumulate(ForwardStats& step, ForwardStats&& f, int64_t index, int64_t micro) {
  if (micro == 1) {  // exactly the pass's statistics
    step = std::move(f);
    return;
  }
  const double weight = 1.0 / static_cast<double>(micro);
  step.loss += weight * f.loss;
  step.aux_loss += weight * f.aux_loss;
  step.z_loss += weight * f.z_loss;
  step.activation_peak_bytes = std::max(step.activation_peak_bytes, f.activation_peak_bytes);
  if (index == 0) {
    step.moe = std::move(f.moe);
    for (nn::MoEStats& m : step.moe) {
      m.aux_loss *= weight;
      m.z_loss *= weight;
    }
    return;
  }
  accumulate_moe(step.moe, f.moe, index, weight);
}

// The step's token count, and per MoE layer the max / mean expert load and the dropped share.
void count_step(StepStats& s, int64_t tokens) {
  s.tokens = tokens;
  int64_t dropped = 0, assignments = 0;
  for (const nn::MoEStats& m : s.forward.moe) {
    double mx = 0, sum = 0;
    for (int64_t l : m.load) {
      mx = std::max(mx, static_cast<double>(l));
      sum += static_cast<double>(l);
    }
    double mean = m.load.empty() ? 0 : sum / static_cast<double>(m.load.size());
    s.load_max_over_mean.push_back(mean > 0 ? mx / mean : 0);
    dropped += m.dropped;
    assignments += m.assignments;
  }
  s.dropped_fraction =
      assignments ? static_cast<double>(dropped) / static_cast<double>(assignments) : 0;
}

// Router centring: the first step of a fresh run calibrates each center on the step's global
// batch; after every update each center moves toward the step's mean router input.
class CenteringHook : public StepHook {
 public:
  using Calibrate = std::function<void(const std::vector<std::pair<Tensor, Tensor>>&)>;
  CenteringHook(Calibrate calibrate, std::function<void(const ForwardStats&)> update)
      : calibrate_(std::move(calibrate)), update_(std::move(update)) {}
  void begin_step(StepContext& ctx) override {
    if (!calibrate_) return;
    std::vector<std::pair<Tensor, Tensor>> parts;
    for (int64_t m = 0; m < ctx.batch.micro; ++m)
      parts.emplace_back(ctx.batch.pass_ids(m), ctx.batch.pass_targets(m));
    calibrate_(parts);
  }
  void end_step(StepContext& ctx) override { update_(ctx.stats.forward); }

 private:
  Calibrate calibrate_;  // empty unless this step calibrates
  std::function<void(const ForwardStats&)> update_;
};

// Aux-loss-free balancing (DeepSeek-V3): each MoE layer's selection bias moves against the
// step's loads. Those are the global batch's (summed over micro-batches and, by reduce_stats or
// the router, over the ranks), so every rank applies the same change and the biases stay equal.
class BalanceBiasHook : public StepHook {
 public:
  BalanceBiasHook(const ModelConfig& model, ParamSet& params) : model_(model), params_(params) {}
  void end_step(StepContext& ctx) override {
    const std::vector<int64_t> blocks = model_.moe_blocks();
    const std::vector<nn::MoEStats>& moe = ctx.stats.forward.moe;
    for (size_t l = 0; l < moe.size(); ++l)
      nn::update_selection_bias(params_.at(str("blocks.", blocks.at(l), ".moe.router.bias")),
                                moe[l].load, model_.balance_bias_rate);
  }

 private:
  const ModelConfig& model_;
  ParamSet& params_;
};

// --tasks: the objective weights this rank's rows (moe/train/tasks.h); each pass's time is the
// tasks' measure, and every replan_every steps the ranks are reallocated by it.
class TasksHook : public StepHook {
 public:
  TasksHook(TaskSet& tasks, int64_t replan_every) : tasks_(tasks), replan_every_(replan_every) {}
  void begin_pass(StepContext& ctx, int64_t, TrainPass& pass) override {
    pass.loss = tasks_.loss();
    pass.loss_scale = ctx.batch.tasks.loss_scale;
  }
  void end_pass(StepContext& ctx) override { tasks_.add_seconds(ctx.pass_seconds); }
  void end_step(StepContext& ctx) override {
    if (replan_every_ > 0 && ctx.step % replan_every_ == 0) ctx.stats.task_replan = tasks_.replan();
  }

 private:
  TaskSet& tasks_;
  int64_t replan_every_;
};

// --zero 3: the dense values exist only around their use, gathered ahead of compute.
class ZeroPrefetchHook : public StepHook {
 public:
  ZeroPrefetchHook(parallel::ZeroPrefetch& prefetch, int64_t layers)
      : prefetch_(prefetch), layers_(layers) {}
  void begin_step(StepContext&) override { prefetch_.take_stats(); }  // this step's only
  void begin_pass(StepContext& ctx, int64_t m, TrainPass& pass) override {
    prefetch_.begin_pass(layers_);
    parallel::ZeroPrefetch* p = &prefetch_;
    pass.params = {[p](int64_t g, bool backward) { p->gather(g, backward); },
                   [p, last = m + 1 == ctx.batch.micro](int64_t g, bool backward) {
                     p->release(g, backward && last);
                   }};
  }
  void end_pass(StepContext& ctx) override {
    if (!ctx.last_pass) return;
    const parallel::PrefetchStats p = prefetch_.take_stats();
    ctx.stats.dense_wait_seconds = p.wait_seconds;
    ctx.stats.dense_gather_seconds = p.gather_seconds;
  }

 private:
  parallel::ZeroPrefetch& prefetch_;
  int64_t layers_;
};

// --placement lpt | flexmoe: each pass places the experts; after the step flexmoe may replan.
class PlacementHook : public StepHook {
 public:
  PlacementHook(TrainingPlacement& placement, std::function<void(std::vector<Replan>&)> apply)
      : placement_(placement), apply_(std::move(apply)) {}
  void begin_pass(StepContext&, int64_t, TrainPass&) override { placement_.begin_pass(); }
  void end_step(StepContext& ctx) override {
    StepStats& s = ctx.stats;
    s.replans = placement_.end_step(ctx.step);
    for (const auto& [block, predicted] : placement_.predicted_s())
      s.moe_predicted_seconds.push_back(predicted);
    if (!s.replans.empty()) apply_(s.replans);
  }

 private:
  TrainingPlacement& placement_;
  std::function<void(std::vector<Replan>&)> apply_;
};

// --offload: the experts' state follows the passes; the step's upload waits are measured.
class StoreHook : public StepHook {
 public:
  StoreHook(offload::TieredStore& store, offload::StepInfo info) : store_(store), info_(info) {}
  void begin_step(StepContext&) override { before_ = store_.stats(); }
  void begin_pass(StepContext& ctx, int64_t m, TrainPass&) override {
    info_.first_micro_batch = m == 0;
    info_.last_micro_batch = m + 1 == ctx.batch.micro;
    store_.begin_step(info_);
  }
  void end_pass(StepContext& ctx) override {
    if (!ctx.last_pass) return;
    const offload::StoreStats after = store_.stats();
    ctx.stats.expert_wait_seconds = after.wait_seconds - before_.wait_seconds;
    ctx.stats.expert_load_seconds = after.load_seconds - before_.load_seconds;
  }

 private:
  offload::TieredStore& store_;
  offload::StepInfo info_;
  offload::StoreStats before_;
};

}  // namespace

DeviceWait breakdown_wait(Device device, bool wait_for_device) {
  if (wait_for_device && device.kind == Device::cuda) return &cuda::synchronize;
  return nullptr;
}

StepHooks Trainer::step_hooks() {
  const ModelConfig& mc = model_->config();
  StepHooks hooks;
  if (mc.balance_bias_rate > 0) hooks.push_back(std::make_unique<BalanceBiasHook>(mc, *params_));
  if (mc.router_center())
    hooks.push_back(std::make_unique<CenteringHook>(
        step_ == 0 && !centers_given_
            ? CenteringHook::Calibrate([this](const std::vector<std::pair<Tensor, Tensor>>& p) {
                calibrate_router_centers(p);
              })
            : CenteringHook::Calibrate(),
        [this](const ForwardStats& f) { update_router_centers(f); }));
  if (tasks_) hooks.push_back(std::make_unique<TasksHook>(*tasks_, train_.task_replan_every));
  if (zero_prefetch_)
    hooks.push_back(std::make_unique<ZeroPrefetchHook>(*zero_prefetch_, mc.layers));
  if (placement_)
    hooks.push_back(std::make_unique<PlacementHook>(
        *placement_, [this](std::vector<Replan>& replans) { apply_replans(replans); }));
  if (store_) {
    offload::StepInfo info;  // what the expert store needs of this step
    info.lr = static_cast<float>(learning_rate());
    info.adam_step = optimizer_->steps_taken() + 1;
    info.gradient_scale = world_size() > 1 ? 1.0f / static_cast<float>(world_size()) : 1.0f;
    info.overlap = train_.clip == 0;  // a clipped step needs every gradient before any update
    info.replicas = expert_replicas();
    hooks.push_back(std::make_unique<StoreHook>(*store_, info));
  }
  return hooks;
}

// The global batch, the same on every rank whatever --grad-accum, drawn outside the activation
// arena (the arena is reset after every pass); the gradients zeroed. Every rank runs the same
// number of passes, so their collectives stay in the same order. --tasks: ids are this rank's
// rows already, in one pass (--grad-accum is refused).
StepBatch Trainer::draw_batch(bool capture_routing, StepStats& s) {
  StepBatch b;
  b.by_task = tasks_ != nullptr;
  b.world = world_size();
  b.rank = rank();
  if (tasks_) {
    b.tasks = tasks_->next();
    b.ids = b.tasks.ids;
    b.targets = b.tasks.targets;
  } else {
    sampler_->next(train_.batch, b.ids, b.targets);
  }
  params_->zero_grad();
  if (parallel::ExchangeStats* stats = layout_->exchange_stats()) *stats = {};
  b.micro = train_.grad_accum;
  b.rows = tasks_ ? b.ids.dim(0) : train_.batch / b.micro / world_size();
  if (capture_routing)  // this rank's tokens in the order its passes see them
    for (int64_t m = 0; m < b.micro; ++m) {
      const Tensor part = b.pass_ids(m);
      s.token_ids.insert(s.token_ids.end(), part.data<int32_t>(),
                         part.data<int32_t>() + part.numel());
    }
  return b;
}

// One forward/backward over pass m's rows: gradients accumulate (+=), each scaled by 1/micro.
void Trainer::run_pass(int64_t m, bool capture_routing, const StepHooks& hooks, StepContext& ctx) {
  const StepBatch& b = ctx.batch;
  {
    ArenaScope scope(arena_);
    nn::RouterStep rs;
    rs.seed = train_.seed;
    rs.step = step_;
    rs.training = true;
    rs.first_token = b.first_token(m);
    rs.capture_routing = capture_routing;
    TrainPass pass;
    pass.loss = logits_loss_;
    pass.loss_scale = static_cast<float>(1.0 / static_cast<double>(b.micro));
    pass.recompute = train_.recompute;
    // Priority scheduling: reduce each block's gradients as the last pass's backward leaves it
    // (only then are they final).
    if (layout_->scheduler() && m + 1 == b.micro)
      pass.grads_ready = [this](std::span<Param* const> ps) { grad_sync_->pack(ps); };
    for (const auto& hook : hooks) hook->begin_pass(ctx, m, pass);
    const Device on = params_->device();
    Timer pass_timer;
    accumulate(ctx.stats.forward,
               model_->forward_backward(b.pass_ids(m).to(on), b.pass_targets(m).to(on), rs, pass),
               m, b.micro);
    ctx.pass_seconds = pass_timer.seconds();
  }
  arena_.reset();
  ctx.last_pass = m + 1 == b.micro;
  for (const auto& hook : hooks) hook->end_pass(ctx);
}

// The step's losses and gradients over the ranks: the gradient reduction runs once, after the
// last pass. A non-finite loss stops the run here, before any update.
void Trainer::reduce_step(const StepBatch& batch, StepStats& s) {
  const ModelConfig& mc = model_->config();
  s.forward.total =
      s.forward.loss + mc.aux_loss_coef * s.forward.aux_loss + mc.z_loss_coef * s.forward.z_loss;
  s.activation_peak_bytes =
      static_cast<int64_t>(std::max(arena_.peak_bytes(), s.forward.activation_peak_bytes));
  if (tasks_ && world_size() > 1) {
    // Ranks compute different numbers of rows: their aux and z losses count by their share of
    // the step's rows (the mean over the ranks below is then the whole batch's, as the gradients'
    // weighting is).
    s.forward.aux_loss *= batch.tasks.loss_scale;
    s.forward.z_loss *= batch.tasks.loss_scale;
  }
  if (world_size() > 1) {
    const PartScope part(StepPart::comm);
    Timer sync;
    if (!layout_->scheduler()) grad_sync_->pack(params_->all());
    grad_sync_->finish(*params_);
    s.grad_sync_seconds = sync.seconds();
    s.a2a_seconds = layout_->exchange_stats()->seconds;
    s.a2a_calls = layout_->exchange_stats()->calls;
    reduce_stats(s);
  }
  if (tasks_) s.tasks = tasks_->finish_step(world_size() > 1 ? world_ : nullptr);
  MOE_CHECK(std::isfinite(s.forward.total), "step ", step_, ": loss is ", s.forward.total,
            " (diverged; try a lower ", flag_for(Setting::lr), " or ", flag_for(Setting::clip),
            ")");
}

// Clip by the global gradient norm, then AdamW: the resident parameters, ZeRO's dense slices
// (then the values all-gathered), the store's experts (those not already updated during
// backward; a non-finite expert value stops the run here too), all with the same clip factor.
void Trainer::update(StepStats& s) {
  if (store_) store_->complete_gradients();
  optim::OffloadedSquareSum offloaded;
  if (store_) offloaded = [this](const Param& p) { return store_->grad_square_sum(p); };
  if (world_size() > 1) {
    s.grad_norm = grad_sync_->global_norm(*params_, offloaded);
    optim::clip_gradients(*params_, train_.clip, s.grad_norm);
  } else {
    s.grad_norm = optim::clip_grad_norm(*params_, train_.clip, offloaded);
  }
  s.lr = learning_rate();
  optimizer_->step(static_cast<float>(s.lr));
  const float clip_scale = optim::clip_scale(train_.clip, s.grad_norm);
  if (zero_) zero_->step(static_cast<float>(s.lr), optimizer_->steps_taken(), clip_scale);
  if (store_) store_->finish_step(clip_scale);
}

// An update that made a parameter non-finite (an infinite --lr, say), or exploded it past 2^32
// while finite (--lr 1e30: the model then computes NaN), stops the run here, before it is
// saved or trained on. Only reads: a healthy run's bits are unchanged. Device parameters are
// checked when saved (no copy every step).
void Trainer::check_parameters() const {
  for (const Param* p : std::as_const(*params_).all())
    if (!p->offloaded && p->value.defined() && p->value.device().kind == Device::cpu &&
        io::first_exploded(p->value) >= 0)
      io::check_not_exploded(str("step ", step_,
                                 ", after the update (the run diverged; nothing saved: "
                                 "try a lower ",
                                 flag_for(Setting::lr), " or ", flag_for(Setting::clip), ")"),
                             p->name, p->value);
}

StepStats Trainer::step(bool capture_routing) {
  Timer timer;
  StepStats s;
  std::optional<StepRecording> recording;
  if (record_breakdown_) {
    const Device device = params_->device();
    recording.emplace(s.breakdown, breakdown_wait(device, breakdown_waits_), device.index);
  }
  MOE_CHECK(!store_ || store_->config().device == params_->device(),
            "the expert store computes on ", store_ ? store_->config().device.str() : std::string(),
            " but the parameters are on ", params_->device().str(), ": call to_device(",
            params_->device().str(), ") before training");
  const StepBatch batch = draw_batch(capture_routing, s);
  const StepHooks hooks = step_hooks();
  StepContext ctx{s, batch, step_};
  for (const auto& hook : hooks) hook->begin_step(ctx);
  arena_.reset_peak();
  for (int64_t m = 0; m < batch.micro; ++m) run_pass(m, capture_routing, hooks, ctx);
  reduce_step(batch, s);
  std::optional<PartScope> optimizer_part(std::in_place, StepPart::optimizer);
  update(s);
  ctx.step = ++step_;
  for (const auto& hook : hooks) hook->end_step(ctx);
  check_parameters();
  optimizer_part.reset();
  count_step(s, train_.batch * model_->config().seq);
  tokens_seen_ += s.tokens;
  s.step = step_;
  recording.reset();  // before the clock stops: the parts then sum to at most `seconds`
  s.seconds = timer.seconds();
  return s;
}

}  // namespace moe::train
