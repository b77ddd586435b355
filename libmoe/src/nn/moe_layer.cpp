// MoE layer forward/backward (see moe/nn/moe_layer.h).
// Shapes: N tokens, D model width, E experts, k experts per token, M kept assignments, S the
// shared expert's hidden width.
#include "moe/nn/moe_layer.h"

#include <algorithm>

#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#include "moe/ops/moe.h"
#include "moe/settings.h"
#include "moe/timer.h"

namespace moe::nn {

MoEConfig MoELayer::checked(const std::string& prefix, const MoEConfig& config,
                            const Parallel* parallel) {
  MOE_USAGE_CHECK(config.router.num_experts == config.experts.num_experts, "moe layer ", prefix,
                  ": router has ", config.router.num_experts, " experts but experts has ",
                  config.experts.num_experts);
  MOE_USAGE_CHECK(config.router.d_model == config.experts.d_model, "moe layer ", prefix,
                  ": router d_model ", config.router.d_model, " differs from experts d_model ",
                  config.experts.d_model);
  MoEConfig c = config;
  if (parallel && parallel->shards_experts()) {
    const int64_t E = config.experts.num_experts, P = parallel->ep_size();
    MOE_USAGE_CHECK(E % P == 0, "moe layer ", prefix, ": its ", E, " experts do not divide over ",
                    flag_for(Setting::ep), " ", P, " expert-parallel ranks");
    c.experts.global_experts = E;
    c.experts.num_experts = E / P;
    c.experts.first_expert = parallel->ep_rank() * (E / P);
  }
  if (parallel && parallel->placement && parallel->expert_parallel()) {
    const int64_t E = config.experts.num_experts;
    std::vector<int64_t> rows = parallel->placement->held_rows(config.block, E);
    if (!rows.empty()) {  // vExpert slots: this rank stores only those
      c.experts.global_experts = E;
      c.experts.num_experts = static_cast<int64_t>(rows.size());
      c.experts.slot_experts = std::move(rows);
    }
  }
  return c;
}

MoELayer::MoELayer(ParamSet& ps, const std::string& prefix, const MoEConfig& config,
                   const Parallel* parallel)
    : config_(checked(prefix, config, parallel)),
      parallel_(parallel),
      router_(ps, prefix + ".router", config_.router),
      experts_(ps, prefix + ".experts", config_.experts,
               parallel ? parallel->expert_store : nullptr) {
  MOE_USAGE_CHECK(config_.shared_ff >= 0, "moe layer ", prefix, ": shared expert width ",
                  config_.shared_ff, " is negative");
  MOE_USAGE_CHECK(!config_.shared_gate || config_.shared_ff > 0, "moe layer ", prefix,
                  ": a shared expert gate needs a shared expert (shared_ff > 0)");
  if (config_.shared_ff == 0) return;
  MOE_USAGE_CHECK(config_.experts.activation != Activation::swiglu_clamped, "moe layer ", prefix,
                  ": a shared expert takes gelu or swiglu; the clamped SwiGLU (gpt-oss) is an "
                  "expert activation only");
  MlpConfig mc;
  mc.d_model = config_.experts.d_model;
  mc.d_ff = config_.shared_ff;
  mc.activation = config_.experts.activation;
  mc.bias = config_.experts.bias;
  mc.init_std = config_.experts.init_std;
  mc.out_init_std = config_.experts.out_init_std;
  shared_ = std::make_unique<MLP>(ps, prefix + ".shared", mc);
  if (config_.shared_gate)
    shared_gate_ = std::make_unique<Linear>(ps, LinearNames{prefix + ".shared_gate.weight", ""},
                                            config_.experts.d_model, 1, config_.experts.init_std);
}

namespace {

// [N] i32 0, 1, ..., N-1: the slot table under which combine_rows scales each row by its own
// weight.
Tensor identity_rows(int64_t n, Device device) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  return Tensor::from_vector({n}, ids).to(device);
}

}  // namespace

void MoELayer::shared_forward(const Tensor& x, Tensor& y, Saved* saved) const {
  Tensor s = shared_->forward(x, saved ? &saved->shared : nullptr);
  if (!shared_gate_) {
    ops::axpy(1.0f, s, y);
    return;
  }
  const int64_t tokens = x.dim(0);
  Tensor g = shared_gate_->forward(x);  // [N,1] logits, then the gate in place
  ops::sigmoid(g, g);
  Tensor gated = Tensor::empty(s.shape(), DType::f32, s.device());
  ops::combine_rows(s, identity_rows(tokens, s.device()), g.reshape({tokens}), 1, gated);
  ops::axpy(1.0f, gated, y);
  if (saved) {
    saved->shared_y = s;
    saved->shared_g = g;
  }
}

void MoELayer::shared_backward(const Tensor& dy, const Saved& saved, Tensor& dx) {
  Tensor ds = dy;
  if (shared_gate_) {
    const int64_t tokens = dy.dim(0);
    MOE_CHECK(saved.shared_y.defined() && saved.shared_g.defined(), "moe layer ",
              router_.weight().name, ": backward without the shared expert gate's forward");
    const Tensor g = saved.shared_g.reshape({tokens});
    ds = Tensor::empty(dy.shape(), DType::f32, dy.device());
    Tensor dg = Tensor::empty({tokens}, DType::f32, dy.device());
    // ds = g * dy, dg = <dy, shared output> per token; then through the sigmoid to the logit.
    ops::combine_rows_backward(dy, saved.shared_y, identity_rows(tokens, dy.device()), g, ds, dg);
    ops::sigmoid_backward(dg, g, dg);
    shared_gate_->backward_into(dg.reshape({tokens, 1}), saved.x, dx, true);
  }
  ops::axpy(1.0f, shared_->backward(ds, saved.shared), dx);
}

// Sums the expert loads (and the token count) over the data-parallel ranks and recomputes the aux
// loss from them: f_e then describes the global batch (see the class comment).
void MoELayer::globalize_load(RouterOutput& routed) const {
  const int64_t E = config_.router.num_experts;
  Tensor counts = Tensor::empty({E + 1}, DType::i64);
  int64_t* c = counts.data<int64_t>();
  std::copy(routed.load.begin(), routed.load.end(), c);
  c[E] = routed.load_tokens;
  parallel_->batch->all_reduce(counts, comm::ReduceOp::sum);
  routed.load.assign(c, c + E);
  routed.load_tokens = c[E];
  routed.aux_loss =
      ops::router_aux_loss(routed.probs, routed.load, routed.load_tokens, config_.router.top_k);
}

Tensor MoELayer::run_experts(const Tensor& x_perm, RouterOutput& routed, const RouterStep& step,
                             Saved* saved, int64_t& rows_computed) const {
  DispatchPlan& plan = routed.plan;
  rows_computed = x_perm.dim(0);
  if (!parallel_ || !parallel_->expert_parallel())
    return experts_forward(x_perm, plan.expert_offsets, saved);
  Timer timer;
  const ExpertAssignment assignment =
      parallel_->placement
          ? parallel_->placement->place(step.layer, routed.topk_idx, plan.tokens_per_expert)
          : ExpertAssignment::contiguous(plan.num_experts, parallel_->ep_size());
  const parallel::ExpertDispatcher dispatcher = this->dispatcher();
  Exchange ex = dispatcher.plan(plan.expert_offsets, plan.tokens_per_expert, assignment);
  plan.send_counts = ex.send_counts;  // the plan states the step's exchange too
  plan.recv_counts = ex.recv_counts;
  rows_computed = static_cast<int64_t>(ex.arrival_of.size());
  Tensor y_local = experts_forward(dispatcher.dispatch(x_perm, ex), ex.local_offsets, saved);
  Tensor y_perm = dispatcher.combine(y_local, ex);
  if (saved) {
    saved->exchange = std::move(ex);
    saved->block = step.layer;
  }
  add_seconds(step.layer, timer.seconds());
  return y_perm;
}

// The experts on the rows this rank computes. Under --recompute moe their activations live in
// the scratch only (a throwaway Saved, so that forward runs exactly as when saving) and only the
// input rows and segments are kept.
Tensor MoELayer::experts_forward(const Tensor& x_local, const std::vector<int32_t>& offsets,
                                 Saved* saved) const {
  if (!saved || !saved->recompute_experts)
    return experts_.forward(x_local, offsets, saved ? &saved->experts : nullptr);
  return saved->recompute_experts->run([&] {
    Experts::Saved full;
    Tensor y = experts_.forward(x_local, offsets, &full);
    saved->experts.x_perm = full.x_perm;  // x_local itself: caller's memory, not the scratch
    saved->experts.expert_offsets = full.expert_offsets;
    return y;
  });
}

Tensor MoELayer::experts_backward_local(const Tensor& dy_local, const Saved& saved) {
  if (!saved.recompute_experts) return experts_.backward(dy_local, saved.experts);
  return saved.recompute_experts->run([&] {
    Experts::Saved full;
    experts_.forward(saved.experts.x_perm, saved.experts.expert_offsets, &full);
    return experts_.backward(dy_local, full);
  });
}

Tensor MoELayer::experts_backward(const Tensor& dy_perm, const Saved& saved) {
  if (!parallel_ || !parallel_->expert_parallel()) return experts_backward_local(dy_perm, saved);
  Timer timer;
  const parallel::ExpertDispatcher dispatcher = this->dispatcher();
  Tensor dx_local = experts_backward_local(dispatcher.dispatch(dy_perm, saved.exchange), saved);
  Tensor dx = dispatcher.combine(dx_local, saved.exchange);
  add_seconds(saved.block, timer.seconds());
  return dx;
}

void MoELayer::add_seconds(int64_t block, double seconds) const {
  parallel::ExchangeStats* stats = parallel_->stats;
  if (!stats || block < 0) return;
  if (stats->moe_seconds.size() <= static_cast<size_t>(block))
    stats->moe_seconds.resize(static_cast<size_t>(block) + 1, 0.0);
  stats->moe_seconds[static_cast<size_t>(block)] += seconds;
}

// The exchange over parallel_'s expert group for this layer's held experts.
parallel::ExpertDispatcher MoELayer::dispatcher() const {
  return parallel::ExpertDispatcher(
      {parallel_->experts, parallel_->exchange, parallel_->scheduler, parallel_->stats},
      router_.weight().name, config_.experts.num_experts, parallel_->placement != nullptr);
}

// Tokens a block when inference runs the experts by blocks: RouterStep::expert_block_tokens, by
// default 64 Mi floats (256 MiB) of the experts' rows (k x (2D + 3F) floats a token: dispatched
// input, hidden, gate, activation, output), at least 1,024 tokens (OLMoE-1B-7B: 1,170); 0 where the
// path does not apply (training, a saved forward, expert parallelism or placement, capacity drops,
// or a batch of at most one block).
int64_t MoELayer::expert_block_tokens(const Tensor& x, const RouterOutput& routed,
                                      const RouterStep& step, const Saved* saved) const {
  if (saved || step.training || routed.plan.capacity != 0) return 0;
  if (parallel_ && (parallel_->expert_parallel() || parallel_->placement)) return 0;
  const int64_t block =
      step.expert_block_tokens > 0
          ? step.expert_block_tokens
          : default_expert_block_tokens(config_.router.top_k, x.dim(1), config_.experts.d_ff);
  return x.dim(0) > block ? block : 0;
}

int64_t default_expert_block_tokens(int64_t top_k, int64_t d_model, int64_t d_ff) {
  return std::max<int64_t>(
      1024, (int64_t(1) << 26) / std::max<int64_t>(1, top_k * (2 * d_model + 3 * d_ff)));
}

// Each block's plan is made from its rows of the batch's top-k (the routing, its statistics and
// traces are the whole batch's); its dispatch, experts and combine run in a scratch and its
// output rows go straight into y. A token's result is its own experts' rows, as in one pass.
Tensor MoELayer::experts_by_blocks(const Tensor& x, const RouterOutput& routed,
                                   int64_t block) const {
  // One scratch a thread for every layer of every model: a scratch a layer would keep a block's
  // rows for each layer (16 layers of OLMoE-1B-7B: 4 GB more than one).
  thread_local Scratch scratch;
  const int64_t n = x.dim(0);
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  for (int64_t a = 0; a < n; a += block) {
    const int64_t b = std::min(n, a + block);
    Tensor into = y.rows(a, b);
    scratch.run(
        [&] {
          const DispatchPlan plan =
              make_plan(routed.topk_idx.rows(a, b), routed.topk_weight.rows(a, b),
                        config_.router.num_experts, 0);
          return combine(
              experts_forward(dispatch(x.rows(a, b), plan), plan.expert_offsets, nullptr), plan);
        },
        &into);
  }
  return y;
}

Tensor MoELayer::forward(const Tensor& x, const RouterStep& step, Saved* saved,
                         MoEStats* stats) const {
  RouterOutput routed = router_.forward(x, step);
  if (parallel_ && parallel_->data_parallel()) globalize_load(routed);
  int64_t rows_computed = 0;
  Tensor x_perm, y_perm, y;
  if (const int64_t block = expert_block_tokens(x, routed, step, saved); block > 0) {
    y = experts_by_blocks(x, routed, block);
    rows_computed = routed.plan.num_slots();
  } else {
    x_perm = dispatch(x, routed.plan);
    y_perm = run_experts(x_perm, routed, step, saved, rows_computed);
    y = combine(y_perm, routed.plan);
  }
  if (shared_) shared_forward(x, y, saved);
  if (stats) {
    stats->aux_loss = routed.aux_loss;
    stats->z_loss = routed.z_loss;
    stats->load = routed.load;
    stats->load_global = parallel_ && parallel_->data_parallel();
    stats->tokens_per_expert = routed.plan.tokens_per_expert;
    stats->assignments = routed.plan.num_tokens * routed.plan.top_k;
    stats->dropped = routed.plan.dropped();
    stats->rows_computed = rows_computed;
    if (router_.center() && (step.training || step.input_sums)) {
      // Column sums, rows in order (a fixed order whatever the thread count).
      Tensor sum = Tensor::zeros({x.dim(1)}, DType::f32, x.device());
      ops::bias_grad(x, sum);
      const Tensor host = sum.to(Device{});
      stats->input_sum.assign(host.data<float>(), host.data<float>() + host.numel());
      stats->input_tokens = x.dim(0);
    }
    if (step.capture_routing) {
      const Tensor idx = routed.topk_idx.to(Device{}), gates = routed.topk_weight.to(Device{});
      const int32_t* c = idx.data<int32_t>();
      const float* g = gates.data<float>();
      stats->choices.assign(c, c + idx.numel());
      stats->gates.assign(g, g + gates.numel());
    }
  }
  if (saved) {
    saved->x = x;
    saved->router = std::move(routed);
    saved->x_perm = x_perm;
    saved->y_perm = y_perm;
  }
  return y;
}

void MoELayer::predict(const Tensor& u, int64_t margin) const {
  ExpertStore* store = experts_.store();
  if (!store) return;
  const Tensor idx = router_.choose(u, config_.router.top_k + margin).to(Device{});
  const int64_t E = config_.router.num_experts, k = idx.dim(1);
  // Per expert: the tokens choosing it, and the best rank it is chosen at.
  std::vector<int64_t> tokens(static_cast<size_t>(E), 0), rank(static_cast<size_t>(E), k);
  const int32_t* c = idx.data<int32_t>();
  for (int64_t i = 0; i < idx.numel(); ++i) {
    const auto e = static_cast<size_t>(c[i]);
    ++tokens[e];
    rank[e] = std::min(rank[e], i % k);
  }
  std::vector<int32_t> experts;
  for (int64_t e = 0; e < E; ++e)
    if (tokens[static_cast<size_t>(e)] > 0) experts.push_back(static_cast<int32_t>(e));
  std::stable_sort(experts.begin(), experts.end(), [&](int32_t a, int32_t b) {
    const auto i = static_cast<size_t>(a), j = static_cast<size_t>(b);
    return tokens[i] != tokens[j] ? tokens[i] > tokens[j] : rank[i] < rank[j];
  });
  store->predict(experts_.store_layer(), experts);
}

Tensor MoELayer::backward(const Tensor& dy, const Saved& saved, float aux_scale, float z_scale) {
  const DispatchPlan& plan = saved.router.plan;
  MOE_CHECK(saved.x.defined() && saved.y_perm.defined(), "moe layer ", router_.weight().name,
            ": backward without a saved forward");
  dy.expect_shape(saved.x.shape(), "moe layer backward dy");
  Tensor dy_perm, dweight_of_slot;
  combine_backward(dy, saved.y_perm, plan, dy_perm, dweight_of_slot);
  Tensor dx_perm = experts_backward(dy_perm, saved);
  Tensor dx = dispatch_backward(dx_perm, plan);
  Tensor dx_router = router_.backward(dweight_of_slot, saved.router, saved.x, aux_scale, z_scale);
  ops::axpy(1.0f, dx_router, dx);
  if (shared_) shared_backward(dy, saved, dx);
  return dx;
}

}  // namespace moe::nn
