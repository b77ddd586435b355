// MoE layer forward/backward (see moe/nn/moe_layer.h).
// Shapes: N tokens, D model width, E experts, k experts per token, M kept assignments.
#include "moe/nn/moe_layer.h"

#include <algorithm>

#include "moe/ops/core.h"
#include "moe/ops/moe.h"
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
    MOE_USAGE_CHECK(E % P == 0, "moe layer ", prefix, ": its ", E,
                    " experts do not divide over --ep ", P, " expert-parallel ranks");
    c.experts.global_experts = E;
    c.experts.num_experts = E / P;
    c.experts.first_expert = parallel->ep_rank() * (E / P);
  }
  return c;
}

MoELayer::MoELayer(ParamSet& ps, const std::string& prefix, const MoEConfig& config,
                   const Parallel* parallel)
    : config_(checked(prefix, config, parallel)),
      parallel_(parallel),
      router_(ps, prefix + ".router", config_.router),
      experts_(ps, prefix + ".experts", config_.experts) {}

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

void MoELayer::exchange(const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
                        const std::vector<int64_t>& recv_counts) const {
  Timer timer;
  if (parallel_->scheduler) {  // ahead of any queued gradient micro-op
    parallel_->scheduler->wait(parallel_->scheduler->all_to_all_v(
        send, send_counts, recv, recv_counts, parallel_->exchange));
  } else {
    parallel_->exchange->run(send, send_counts, recv, recv_counts);
  }
  if (ExchangeStats* st = parallel_->stats) {
    st->calls += 1;
    st->bytes += static_cast<int64_t>(send.nbytes());
    st->seconds += timer.seconds();
  }
}

// Counts and row order of the step's exchange. Source rank s (this rank) splits its rows of
// expert e (one run of x_perm: slots are in expert order) into chunks for e's replicas, groups
// them by destination rank (experts ascending inside each), and exchanges the [P, H] counts; the
// arrivals, source-major, are regrouped to held-expert-major for one grouped GEMM. Static layout:
// rank p holds experts [p H, (p+1) H), every expert one replica, and the send order is x_perm's.
MoELayer::Exchange MoELayer::plan_exchange(DispatchPlan& plan,
                                           const ExpertAssignment& assignment) const {
  Timer timer;
  const int P = parallel_->ep_size(), s = parallel_->ep_rank();
  const int64_t E = plan.num_experts, H = config_.experts.num_experts;
  const bool placed = parallel_->placement != nullptr;
  MOE_CHECK(static_cast<int64_t>(assignment.replicas.size()) == E, "moe layer ",
            router_.weight().name, ": placement for ", assignment.replicas.size(),
            " experts, the layer has ", E);
  // Chunks per destination: (expert, first x_perm row, rows).
  struct Chunk {
    int64_t expert, begin, rows;
  };
  std::vector<std::vector<Chunk>> to(static_cast<size_t>(P));
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int32_t>& reps = assignment.replicas[static_cast<size_t>(e)];
    const auto n = static_cast<int64_t>(reps.size());
    MOE_CHECK(n >= 1, "moe layer ", router_.weight().name, ": expert ", e, " has no rank");
    const int64_t first = plan.expert_offsets[static_cast<size_t>(e)];
    const int64_t count = plan.tokens_per_expert[static_cast<size_t>(e)];
    for (int64_t j = 0; j < n; ++j) {
      const int32_t p = reps[static_cast<size_t>((j + s) % n)];
      MOE_CHECK(p >= 0 && p < P, "moe layer ", router_.weight().name, ": expert ", e,
                " placed on rank ", p, " of ", P);
      const int64_t b = split_begin(count, n, j), rows = split_begin(count, n, j + 1) - b;
      if (rows > 0) to[static_cast<size_t>(p)].push_back({e, first + b, rows});
    }
  }
  Tensor mine = Tensor::empty({P, H}, DType::i64);
  int64_t* m = mine.data<int64_t>();
  std::fill_n(m, P * H, 0);
  plan.send_counts.assign(static_cast<size_t>(P), 0);
  Exchange ex;
  bool identity = true;
  int64_t next = 0;
  for (int p = 0; p < P; ++p)
    for (const Chunk& c : to[static_cast<size_t>(p)]) {
      const int64_t h = placed ? c.expert : c.expert - p * H;  // held index on rank p
      MOE_CHECK(h >= 0 && h < H, "moe layer ", router_.weight().name, ": expert ", c.expert,
                " is not held by rank ", p);
      m[p * H + h] += c.rows;
      plan.send_counts[static_cast<size_t>(p)] += c.rows;
      identity = identity && c.begin == next;
      next = c.begin + c.rows;
    }
  if (!identity) {
    ex.send_of.reserve(static_cast<size_t>(plan.num_slots()));
    for (int p = 0; p < P; ++p)
      for (const Chunk& c : to[static_cast<size_t>(p)])
        for (int64_t i = 0; i < c.rows; ++i)
          ex.send_of.push_back(static_cast<int32_t>(c.begin + i));
  }
  Tensor theirs = Tensor::empty({P, H}, DType::i64);
  const std::vector<int64_t> ones(static_cast<size_t>(P), 1);  // one row of H per rank
  parallel_->experts->all_to_all_v(mine, ones, theirs, ones);
  const int64_t* t = theirs.data<int64_t>();
  ex.recv_per_expert.assign(t, t + P * H);
  plan.recv_counts.assign(static_cast<size_t>(P), 0);
  std::vector<int64_t> source_start(static_cast<size_t>(P * H));  // arrival row of (source, h)
  int64_t row = 0;
  for (int q = 0; q < P; ++q)
    for (int64_t h = 0; h < H; ++h) {
      source_start[static_cast<size_t>(q * H + h)] = row;
      row += t[q * H + h];
      plan.recv_counts[static_cast<size_t>(q)] += t[q * H + h];
    }
  ex.local_offsets.assign(static_cast<size_t>(H) + 1, 0);
  ex.arrival_of.reserve(static_cast<size_t>(row));
  for (int64_t h = 0; h < H; ++h) {
    for (int q = 0; q < P; ++q) {
      const int64_t first = source_start[static_cast<size_t>(q * H + h)];
      for (int64_t i = 0; i < t[q * H + h]; ++i)
        ex.arrival_of.push_back(static_cast<int32_t>(first + i));
    }
    ex.local_offsets[static_cast<size_t>(h) + 1] = static_cast<int32_t>(ex.arrival_of.size());
  }
  if (ExchangeStats* st = parallel_->stats) st->seconds += timer.seconds();
  return ex;
}

// dst[i] = src[index[i]] (gather) or dst[index[i]] = src[i] (scatter), whole rows; `index` is a
// permutation of 0..n-1 when scattering. Both are one ops::gather_rows on the rows' device (a
// scatter gathers by the inverse permutation).
static Tensor move_rows(const Tensor& src, const std::vector<int32_t>& index, bool gather) {
  const int64_t n = static_cast<int64_t>(index.size());
  std::vector<int32_t> order = index;
  if (!gather)
    for (int64_t i = 0; i < n; ++i)
      order[static_cast<size_t>(index[static_cast<size_t>(i)])] = static_cast<int32_t>(i);
  Tensor dst = Tensor::empty({n, src.dim(1)}, DType::f32, src.device());
  ops::gather_rows(src, Tensor::from_vector({n}, order).to(src.device()), dst);
  return dst;
}

Tensor MoELayer::run_experts(const Tensor& x_perm, RouterOutput& routed, const RouterStep& step,
                             Saved* saved) const {
  DispatchPlan& plan = routed.plan;
  Experts::Saved* es = saved ? &saved->experts : nullptr;
  if (!parallel_ || !parallel_->expert_parallel())
    return experts_.forward(x_perm, plan.expert_offsets, es);
  const ExpertAssignment assignment =
      parallel_->placement
          ? parallel_->placement->place(step.layer, routed.topk_idx, plan.tokens_per_expert)
          : ExpertAssignment::contiguous(plan.num_experts, parallel_->ep_size());
  Exchange ex = plan_exchange(plan, assignment);
  const int64_t D = config_.experts.d_model;
  const auto arrivals = static_cast<int64_t>(ex.arrival_of.size());
  Tensor x_recv = Tensor::empty({arrivals, D}, DType::f32, x_perm.device());
  exchange(ex.send_of.empty() ? x_perm : move_rows(x_perm, ex.send_of, true), plan.send_counts,
           x_recv, plan.recv_counts);
  Tensor y_local = experts_.forward(move_rows(x_recv, ex.arrival_of, true), ex.local_offsets, es);
  Tensor y_send = move_rows(y_local, ex.arrival_of, false);
  Tensor y_perm = Tensor::empty({plan.num_slots(), D}, DType::f32, x_perm.device());
  exchange(y_send, plan.recv_counts, y_perm, plan.send_counts);
  if (!ex.send_of.empty()) y_perm = move_rows(y_perm, ex.send_of, false);
  if (saved) saved->exchange = std::move(ex);
  return y_perm;
}

Tensor MoELayer::experts_backward(const Tensor& dy_perm, const Saved& saved) {
  if (!parallel_ || !parallel_->expert_parallel()) return experts_.backward(dy_perm, saved.experts);
  MOE_CHECK(!parallel_->placement, "moe layer ", router_.weight().name,
            ": dynamic expert placement is for inference; backward needs the static layout");
  const DispatchPlan& plan = saved.router.plan;
  const Exchange& ex = saved.exchange;
  const int64_t D = config_.experts.d_model;
  Tensor dy_recv =
      Tensor::empty({static_cast<int64_t>(ex.arrival_of.size()), D}, DType::f32, dy_perm.device());
  exchange(dy_perm, plan.send_counts, dy_recv, plan.recv_counts);
  Tensor dx_local = experts_.backward(move_rows(dy_recv, ex.arrival_of, true), saved.experts);
  Tensor dx_send = move_rows(dx_local, ex.arrival_of, false);
  Tensor dx_perm = Tensor::empty({plan.num_slots(), D}, DType::f32, dy_perm.device());
  exchange(dx_send, plan.recv_counts, dx_perm, plan.send_counts);
  return dx_perm;
}

Tensor MoELayer::forward(const Tensor& x, const RouterStep& step, Saved* saved,
                         MoEStats* stats) const {
  RouterOutput routed = router_.forward(x, step);
  if (parallel_ && parallel_->data_parallel()) globalize_load(routed);
  Tensor x_perm = dispatch(x, routed.plan);
  Tensor y_perm = run_experts(x_perm, routed, step, saved);
  Tensor y = combine(y_perm, routed.plan);
  if (stats) {
    stats->aux_loss = routed.aux_loss;
    stats->z_loss = routed.z_loss;
    stats->load = routed.load;
    stats->load_global = parallel_ && parallel_->data_parallel();
    stats->tokens_per_expert = routed.plan.tokens_per_expert;
    stats->assignments = routed.plan.num_tokens * routed.plan.top_k;
    stats->dropped = routed.plan.dropped();
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
  return dx;
}

}  // namespace moe::nn
