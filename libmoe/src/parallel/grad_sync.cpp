// Gradient reduction across the rank groups (see moe/parallel/grad_sync.h).
#include "moe/parallel/grad_sync.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "moe/ops/core.h"
#include "moe/parallel/zero.h"

namespace moe::parallel {

GradSync::GradSync(Layout& layout, const ParamSet& params) : layout_(layout), params_(params) {
  size_buffers(Device{});
}

// Each fused buffer holds the gradients of the parameters that reduce over its group.
void GradSync::size_buffers(Device device) {
  MOE_CHECK(fill_[0] == 0 && fill_[1] == 0, "gradient buffers resized while gradients are packed");
  int64_t sizes[2] = {0, 0};
  for (const Param* p : params_.all())
    if (reduce_of(*p) == Reduce::world || reduce_of(*p) == Reduce::replicas)
      sizes[static_cast<int>(reduce_of(*p))] += p->numel();  // (--zero 3 may have no grad yet)
  for (int g = 0; g < 2; ++g) buffer_[g] = Tensor::empty({sizes[g]}, DType::f32, device);
}

GradSync::Reduce GradSync::reduce_of(const Param& p) const {
  if (p.offloaded) return Reduce::none;  // its store sums and averages it (TieredStore)
  if (p.frozen) return Reduce::none;     // no gradient to reduce (a router's selection bias)
  if (held_of_.count(&p)) return Reduce::holders;
  if (shards_ && shards_->stage() >= 2 && shards_->covers(p)) return Reduce::sharded;
  // A slice of the experts (plain expert parallelism). Under a placement policy every rank holds
  // whole expert tensors and computed some of their rows: they sum over the world like dense ones.
  if (p.expert && p.shard.defined())
    return layout_.replicas()->size() > 1 ? Reduce::replicas : Reduce::none;
  if (p.shard.defined()) return Reduce::none;  // the sharded token table: summed by its backward
  return Reduce::world;
}

// With the scheduler, every whole --partition-mb of packed gradients is submitted as soon as it
// is complete (finish() sends the rest), so the micro-ops are full-sized and start while backward
// goes on.
void GradSync::pack(std::span<Param* const> params) {
  comm::CommScheduler* scheduler = layout_.scheduler();
  for (int g = 0; g < 2; ++g) {
    for (Param* p : params) {
      if (static_cast<int>(reduce_of(*p)) != g) continue;
      const int64_t n = p->grad.numel();
      Tensor packed = buffer_[g].rows(fill_[g], fill_[g] + n);
      packed.copy_from(p->grad.reshape({n}));  // on the gradients' device
      packed_[g].emplace_back(p, fill_[g]);
      fill_[g] += n;
    }
    if (scheduler) {
      const auto piece =
          std::max<int64_t>(1, static_cast<int64_t>(scheduler->partition_bytes() / sizeof(float)));
      submit(g, (fill_[g] - sent_[g]) / piece * piece);
    }
  }
}

void GradSync::submit(int group, int64_t elements) {
  if (elements <= 0) return;
  Tensor region = buffer_[group].rows(sent_[group], sent_[group] + elements);
  layout_.scheduler()->all_reduce(region, comm::ReduceOp::sum,
                                  group == 1 ? layout_.replicas() : nullptr);
  sent_[group] += elements;
}

// The sum over all W ranks' tokens (dense: all-reduce over the world; experts: each replica's
// group already holds its group's tokens, summed over the replicas; sharded table: summed by its
// backward) divided by W.
void GradSync::finish(ParamSet& params) {
  if (comm::CommScheduler* scheduler = layout_.scheduler()) {
    for (int g = 0; g < 2; ++g) submit(g, fill_[g] - sent_[g]);
    scheduler->wait_all();
  } else {
    if (fill_[0] > 0) {
      Tensor region = buffer_[0].rows(0, fill_[0]);
      layout_.world()->all_reduce(region, comm::ReduceOp::sum);
    }
    if (fill_[1] > 0) {
      Tensor region = buffer_[1].rows(0, fill_[1]);
      layout_.replicas()->all_reduce(region, comm::ReduceOp::sum);
    }
  }
  reduce_held();
  if (shards_) shards_->reduce_gradients();  // stage 2: its slices, already averaged
  const float inverse = 1.0f / static_cast<float>(layout_.size());
  for (int g = 0; g < 2; ++g) {
    if (fill_[g] > 0) {  // one pass over the reduced buffer, then copies back
      Tensor reduced = buffer_[g].rows(0, fill_[g]);
      ops::scale(reduced, inverse);
    }
    for (auto [p, offset] : packed_[g]) {
      const int64_t n = p->grad.numel();
      Tensor grad = p->grad.reshape({n});
      grad.copy_from(buffer_[g].rows(offset, offset + n));
    }
    packed_[g].clear();
    fill_[g] = sent_[g] = 0;
  }
  for (Param* p : params.all())
    if ((reduce_of(*p) == Reduce::none || reduce_of(*p) == Reduce::holders) && !p->offloaded)
      ops::scale(p->grad, inverse);
}

// The same sum on every rank of a group: each rank's value gathered (as its bits), added in rank
// order.
static double sum_over(comm::Communicator& group, double value) {
  Tensor mine = Tensor::empty({1}, DType::i64);
  std::memcpy(mine.data<int64_t>(), &value, sizeof value);
  Tensor all = Tensor::empty({group.size()}, DType::i64);
  group.all_gather(mine, all);
  double sum = 0;
  for (int r = 0; r < group.size(); ++r) {
    double v;
    std::memcpy(&v, all.data<int64_t>() + r, sizeof v);
    sum += v;
  }
  return sum;
}

double GradSync::global_norm(const ParamSet& params,
                             const optim::OffloadedSquareSum& offloaded) const {
  double replicated = 0, experts = 0, table = 0;
  for (const Param* p : params.all()) {
    MOE_CHECK(!p->offloaded || offloaded, "'", p->name,
              "' is offloaded but no store sums its gradient");
    if (auto it = held_of_.find(p); it != held_of_.end()) {  // each expert on its first holder
      const HeldLayer& layer = held_[it->second];
      const int me = layout_.experts()->rank();
      for (size_t e = 0; e < layer.holders.size(); ++e)
        if (layer.holders[e].front() == me) {
          const int64_t row = layer.row[e];
          experts += ops::sum_squares(p->grad.rows(row, row + 1));
        }
      continue;
    }
    const double sq = p->offloaded                       ? offloaded(*p)
                      : reduce_of(*p) == Reduce::sharded ? shards_->square_sum(*p)
                                                         : optim::grad_square_sum(*p);
    if (p->expert && p->shard.defined())
      experts += sq;
    else if (p->shard.defined())
      table += sq;
    else
      replicated += sq;
  }
  if (layout_.experts()) experts = sum_over(*layout_.experts(), experts);
  if (layout_.embedding()) table = sum_over(*layout_.world(), table);
  return std::sqrt(replicated + experts + table);
}

void GradSync::set_expert_holders(std::span<Param* const> params,
                                  const std::vector<std::vector<int32_t>>& holders,
                                  const std::vector<int32_t>& row) {
  comm::Communicator* group = layout_.experts();
  MOE_CHECK(group && group->size() == layout_.size(),
            "expert holders need one expert group spanning the world");
  MOE_CHECK(!params.empty(), "set_expert_holders: no parameters");
  const auto E = static_cast<int64_t>(holders.size());
  MOE_CHECK(static_cast<int64_t>(row.size()) == E, "set_expert_holders: ", row.size(), " rows for ",
            E, " experts");
  for (Param* p : params)
    for (int64_t e = 0; e < E; ++e) {
      const std::vector<int32_t>& h = holders[static_cast<size_t>(e)];
      const bool mine = std::binary_search(h.begin(), h.end(), group->rank());
      const int32_t r = row[static_cast<size_t>(e)];
      MOE_CHECK(p->expert && !p->shard.defined() && (mine ? r >= 0 && r < p->grad.dim(0) : r < 0),
                "'", p->name, "': expert ", e, " at row ", r, " of ", p->grad.dim(0),
                mine ? " (held here)" : " (not held here)");
    }
  auto it = held_of_.find(params.front());
  size_t index = it != held_of_.end() ? it->second : held_.size();
  if (index == held_.size()) {  // these no longer go through the world buffer
    held_.push_back({{params.begin(), params.end()}, {}, {}});
    for (Param* p : params) held_of_[p] = index;
    size_buffers(buffer_[0].device());
  }
  held_[index].holders = holders;
  held_[index].row = row;
  const int me = group->rank();
  for (const std::vector<int32_t>& h : holders) {  // same order on every rank: split together
    MOE_CHECK(!h.empty() && std::is_sorted(h.begin(), h.end()),
              "expert holders must be a "
              "non-empty ascending list of ranks");
    if (h.size() < 2 || groups_.count(h)) continue;
    const bool member = std::binary_search(h.begin(), h.end(), me);
    groups_[h] = group->split(member ? 0 : -1, me);
  }
}

// Layer by layer in the order they were set, expert by expert ascending: every rank meets the
// groups it belongs to in the same relative order, so the collectives cannot deadlock. One
// all-gather per replicated expert: its rows of every tensor of the layer, packed.
void GradSync::reduce_held() {
  const int me = layout_.experts() ? layout_.experts()->rank() : 0;
  for (const HeldLayer& layer : held_)
    for (size_t e = 0; e < layer.holders.size(); ++e) {
      const std::vector<int32_t>& h = layer.holders[e];
      if (h.size() < 2 || !std::binary_search(h.begin(), h.end(), me)) continue;
      const int64_t row = layer.row[e];
      int64_t total = 0;
      for (const Param* p : layer.params) total += p->grad.numel() / p->grad.dim(0);
      Tensor packed = Tensor::empty({total}, DType::f32, layer.params.front()->grad.device());
      int64_t at = 0;
      for (const Param* p : layer.params) {
        const int64_t n = p->grad.numel() / p->grad.dim(0);
        packed.rows(at, at + n).copy_from(p->grad.rows(row, row + 1).reshape({n}));
        at += n;
      }
      // Every holder must end with the same bits (its replica's update is the others'), which an
      // all-reduce does not promise for 3 or more ranks: gather the partial sums and add them in
      // rank order on every holder.
      comm::Communicator& replicas = *groups_.at(h);
      Tensor partial = Tensor::empty({replicas.size() * total}, DType::f32, packed.device());
      replicas.all_gather(packed, partial);
      packed.copy_from(partial.rows(0, total));
      for (int r = 1; r < replicas.size(); ++r)
        ops::axpy(1.0f, partial.rows(r * total, (r + 1) * total), packed);
      at = 0;
      for (Param* p : layer.params) {
        const int64_t n = p->grad.numel() / p->grad.dim(0);
        Tensor dst = p->grad.rows(row, row + 1).reshape({n});
        dst.copy_from(packed.rows(at, at + n));
        at += n;
      }
    }
}

void GradSync::to(Device device) { size_buffers(device); }

void GradSync::set_dense_shards(DenseShards* shards) {
  shards_ = shards;
  size_buffers(buffer_[0].device());
}

}  // namespace moe::parallel
