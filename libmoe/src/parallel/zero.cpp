// ZeRO stages 1, 2 and 3 for the dense parameters (see moe/parallel/zero.h). S: elements of the
// flat dense space; R ranks; this rank's slice [mine_, mine_end_).
#include "moe/parallel/zero.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "kernels/adamw.h"
#include "moe/arena.h"
#include "moe/ops/core.h"

namespace moe::parallel {

namespace {

// The tag of the running sum of squares handed to the next rank (stage 2).
constexpr int kSquareSumTag = 7301;

// s plus the squares of t's elements, added one by one in order: on the CPU exactly the sum
// ops::sum_squares computes from zero, continued from s (a parameter split between two ranks'
// slices gets the double a whole-tensor sum gives). On a device the kernel sums its own way and
// the continuation is one addition (equal to the whole sum to rounding, not bitwise).
double add_squares(double s, const Tensor& t) {
  if (t.numel() == 0) return s;
  if (t.device().kind != Device::cpu) return s + ops::sum_squares(t);
  const float* p = t.data<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) s += static_cast<double>(p[i]) * p[i];
  return s;
}

}  // namespace

bool DenseShards::shardable(const Param& p) {
  return !p.offloaded && !p.frozen && !p.expert && !p.shard.defined();
}

DenseShards::DenseShards(comm::Communicator& group, ParamSet& params, int stage,
                         const optim::AdamWConfig& config, int64_t bucket_bytes,
                         const GroupOf& group_of)
    : group_(group),
      stage_(stage),
      config_(config),
      bucket_(std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(sizeof(float)))),
      dtype_(params.dtype()),
      device_(params.device()) {
  MOE_USAGE_CHECK(stage >= 1 && stage <= 3, "DenseShards: stage ", stage, " (1, 2 or 3)");
  MOE_CHECK(stage < 3 || group_of, "DenseShards: stage 3 needs each parameter's gather group");
  offsets_.push_back(0);
  for (Param* p : params.all())
    if (shardable(*p)) {
      params_.push_back(p);
      offsets_.push_back(offsets_.back() + p->numel());
    }
  mine_ = begin(group.rank());
  mine_end_ = end(group.rank());
  const int64_t n = mine_end_ - mine_;
  const Device device = params.device();
  m_ = Tensor::zeros({n}, DType::f32, device);
  v_ = Tensor::zeros({n}, DType::f32, device);
  if (params.dtype() != DType::f32) {  // 16-bit storage: fp32 masters of this slice
    master_ = Tensor::empty({n}, DType::f32, device);
    for (const Piece& pc : pieces(mine_, mine_end_))
      master_.rows(pc.flat_offset - mine_, pc.flat_offset - mine_ + pc.count)
          .copy_from(pc.param->value.reshape({pc.param->numel()})
                         .rows(pc.param_offset, pc.param_offset + pc.count));
  }
  if (stage >= 2) grad_ = Tensor::zeros({n}, DType::f32, device);
  if (stage < 3) return;
  // Stage 3: this rank keeps its slice of the values; the parameters' own storage goes.
  values_ = Tensor::empty({n}, dtype_, device);
  for (const Piece& pc : pieces(mine_, mine_end_))
    values_.rows(pc.flat_offset - mine_, pc.flat_offset - mine_ + pc.count)
        .copy_from(pc.param->value.reshape({pc.param->numel()})
                       .rows(pc.param_offset, pc.param_offset + pc.count));
  for (size_t i = 0; i < params_.size(); ++i) {  // consecutive parameters of a group: one run
    const int64_t g = group_of(*params_[i]);
    std::vector<std::pair<size_t, size_t>>& runs = runs_[g];
    if (!runs.empty() && runs.back().second == i)
      runs.back().second = i + 1;
    else
      runs.emplace_back(i, i + 1);
  }
  for (Param* p : params_) {
    group_of_.push_back(group_of(*p));
    p->value = Tensor();
    p->compute = Tensor();
    p->grad = Tensor();  // made for each backward (gather(g, true)), reduced and dropped after
  }
}

// ---- stage 3: values materialised around their use --------------------------------------------

// Each range bucket by bucket: every rank's part of [a, b) of the flat space, this rank's from
// its slice.
std::vector<Tensor> GatherJob::run(comm::Communicator& comm) const {
  const auto R = static_cast<int64_t>(bounds.size()) - 1;
  const int64_t mine_end = mine + slice.numel();
  std::vector<Tensor> out;
  for (auto [begin, end] : ranges) {
    Tensor into = Tensor::empty({end - begin}, dtype, device);
    for (int64_t a = begin; a < end; a += bucket) {
      const int64_t b = std::min(end, a + bucket);
      const int64_t lo = std::max(a, mine), hi = std::min(b, mine_end);
      Tensor send = lo < hi ? slice.rows(lo - mine, hi - mine) : slice.rows(0, 0);
      Tensor recv = into.rows(a - begin, b - begin);
      std::vector<int64_t> counts(static_cast<size_t>(R));
      for (int64_t r = 0; r < R; ++r)
        counts[static_cast<size_t>(r)] =
            std::max<int64_t>(0, std::min(b, bounds[static_cast<size_t>(r) + 1]) -
                                     std::max(a, bounds[static_cast<size_t>(r)]));
      comm.all_gatherv(send, recv, counts);
    }
    out.push_back(std::move(into));
  }
  return out;
}

const std::vector<std::pair<size_t, size_t>>& DenseShards::runs_of(int64_t g) const {
  static const std::vector<std::pair<size_t, size_t>> none;
  const auto it = runs_.find(g);  // never inserts: a prefetch thread may read runs_ meanwhile
  return it == runs_.end() ? none : it->second;
}

GatherJob DenseShards::job(int64_t g) const {
  GatherJob j;
  j.slice = values_;
  j.mine = mine_;
  for (auto [first, last] : runs_of(g)) j.ranges.emplace_back(offsets_[first], offsets_[last]);
  for (int r = 0; r <= group_.size(); ++r) j.bounds.push_back(begin(r));
  j.bucket = bucket_;
  j.dtype = dtype_;
  j.device = device_;
  return j;
}

bool DenseShards::gathered(int64_t g) const {
  const auto it = gathered_.find(g);
  return it != gathered_.end() && it->second;
}

// One buffer per run of a group's parameters (consecutive in the flat space: a block's dense
// parameters are), the parameters' tensors views of it: one collective per run and bucket.
void DenseShards::gather(int64_t g, bool with_grads) {
  if (stage_ < 3) return;
  HeapScope heap;  // not the pass's activation arena: grads outlive its micro-batch
  install(g, gathered(g) ? std::vector<Tensor>{} : job(g).run(group_), with_grads);
}

void DenseShards::install(int64_t g, std::vector<Tensor> values, bool with_grads) {
  if (stage_ < 3) return;
  HeapScope heap;
  const std::vector<std::pair<size_t, size_t>>& runs = runs_of(g);
  std::vector<Tensor>& grads = grad_buffers_[g];
  if (with_grads && grads.empty())  // backward accumulates into them, over the micro-batches
    for (auto [first, last] : runs) {
      grads.push_back(Tensor::zeros({offsets_[last] - offsets_[first]}, DType::f32, device_));
      for (size_t i = first; i < last; ++i)
        params_[i]->grad =
            grads.back()
                .rows(offsets_[i] - offsets_[first], offsets_[i + 1] - offsets_[first])
                .reshape(params_[i]->shape);
    }
  if (gathered(g)) return;
  MOE_CHECK(values.size() == runs.size(), "DenseShards::install: group ", g, " has ", runs.size(),
            " runs, got ", values.size(), " buffers");
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto [first, last] = runs[r];
    for (size_t i = first; i < last; ++i) {
      Param& p = *params_[i];
      p.value = values[r]
                    .rows(offsets_[i] - offsets_[first], offsets_[i + 1] - offsets_[first])
                    .reshape(p.shape);
      p.refresh_compute();
    }
  }
  gathered_[g] = true;
}

void DenseShards::release(int64_t g, bool reduce_grads) {
  if (stage_ < 3) return;
  const std::vector<std::pair<size_t, size_t>>& runs = runs_of(g);
  std::vector<Tensor>& grads = grad_buffers_[g];
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto [first, last] = runs[r];
    for (size_t i = first; i < last; ++i) {
      params_[i]->value = Tensor();
      params_[i]->compute = Tensor();
    }
    if (!reduce_grads || grads.empty()) continue;
    reduce_range(offsets_[first], offsets_[last], grads[r]);
    for (size_t i = first; i < last; ++i) params_[i]->grad = Tensor();
  }
  if (reduce_grads) grads.clear();
  gathered_[g] = false;
}

// The gradients of flat positions [begin, end) (`flat`, contiguous), reduce-scattered into the
// slice bucket by bucket: each element of the slice is written once per step, as the
// whole-space reduce-scatter of stage 2 writes it.
void DenseShards::reduce_range(int64_t begin, int64_t end, const Tensor& flat) {
  for (int64_t a = begin; a < end; a += bucket_) {
    const int64_t b = std::min(end, a + bucket_);
    const int64_t lo = std::max(a, mine_), hi = std::min(b, mine_end_);
    Tensor recv = lo < hi ? grad_.rows(lo - mine_, hi - mine_) : grad_.rows(0, 0);
    group_.reduce_scatterv(flat.rows(a - begin, b - begin), recv, counts(a, b),
                           comm::ReduceOp::sum);
  }
}

// A gradient no release() reduced (a pass without hooks): now, and dropped.
void DenseShards::reduce_param(size_t i) {
  Param& p = *params_[i];
  if (!p.grad.defined()) return;
  reduce_range(offsets_[i], offsets_[i + 1], p.grad.reshape({p.numel()}));
  p.grad = Tensor();
}

void DenseShards::gather_all() {
  for (int64_t g : std::set<int64_t>(group_of_.begin(), group_of_.end())) gather(g);
}

void DenseShards::release_all() {
  for (int64_t g : std::set<int64_t>(group_of_.begin(), group_of_.end())) release(g, false);
}

std::vector<std::pair<std::string, Tensor>> DenseShards::gather_values() const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (stage_ < 3) return out;
  GatherJob all = job(0);
  all.ranges = {{0, total()}};
  const Tensor whole = all.run(group_).front();
  for (size_t i = 0; i < params_.size(); ++i)
    out.emplace_back(params_[i]->name,
                     whole.rows(offsets_[i], offsets_[i + 1]).reshape(params_[i]->shape));
  return out;
}

void DenseShards::load_values(const std::map<std::string, Tensor>& whole) {
  if (stage_ < 3) return;
  for (const Piece& pc : pieces(mine_, mine_end_)) {
    auto it = whole.find(pc.param->name);
    MOE_CHECK(it != whole.end(), "resume: missing tensor '", pc.param->name, "'");
    MOE_CHECK(it->second.shape() == pc.param->shape, "resume: ", it->second.describe(),
              " does not match '", pc.param->name, "' ", shape_str(pc.param->shape));
    values_.rows(pc.flat_offset - mine_, pc.flat_offset - mine_ + pc.count)
        .copy_from(it->second.reshape({pc.param->numel()})
                       .rows(pc.param_offset, pc.param_offset + pc.count));
  }
}

Tensor DenseShards::value_of(const Piece& pc) const {
  if (stage_ >= 3) return values_.rows(pc.flat_offset - mine_, pc.flat_offset - mine_ + pc.count);
  return pc.param->value.reshape({pc.param->numel()})
      .rows(pc.param_offset, pc.param_offset + pc.count);
}

bool DenseShards::covers(const Param& p) const {
  return std::find(params_.begin(), params_.end(), &p) != params_.end();
}

int64_t DenseShards::begin(int rank) const {
  return total() * static_cast<int64_t>(rank) / static_cast<int64_t>(group_.size());
}

std::vector<DenseShards::Piece> DenseShards::pieces(int64_t begin, int64_t end) const {
  std::vector<Piece> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t lo = std::max(begin, offsets_[i]), hi = std::min(end, offsets_[i + 1]);
    if (lo < hi) out.push_back({params_[i], lo - offsets_[i], lo, hi - lo});
  }
  return out;
}

std::vector<int64_t> DenseShards::counts(int64_t begin, int64_t end) const {
  std::vector<int64_t> out(static_cast<size_t>(group_.size()));
  for (int r = 0; r < group_.size(); ++r)
    out[static_cast<size_t>(r)] =
        std::max<int64_t>(0, std::min(end, this->end(r)) - std::max(begin, this->begin(r)));
  return out;
}

// Bucket by bucket of the flat space: pack every covered gradient's part of it, reduce-scatter
// (each rank receives the sum of its slice's part), then the 1/R of the mean, as GradSync does.
void DenseShards::reduce_gradients() {
  if (stage_ < 2) return;
  const Device device = grad_.device();
  // Stage 3: each group's gradients went when its backward released it; any left (a pass
  // without hooks) go now, one parameter at a time.
  for (size_t i = 0; stage_ >= 3 && i < params_.size(); ++i) reduce_param(i);
  grad_buffers_.clear();
  for (int64_t a = 0; stage_ < 3 && a < total(); a += bucket_) {
    const int64_t b = std::min(total(), a + bucket_);
    Tensor send = Tensor::empty({b - a}, DType::f32, device);
    for (const Piece& pc : pieces(a, b))
      send.rows(pc.flat_offset - a, pc.flat_offset - a + pc.count)
          .copy_from(pc.param->grad.reshape({pc.param->numel()})
                         .rows(pc.param_offset, pc.param_offset + pc.count));
    const int64_t lo = std::max(a, mine_), hi = std::min(b, mine_end_);
    Tensor recv = lo < hi ? grad_.rows(lo - mine_, hi - mine_) : grad_.rows(0, 0);
    group_.reduce_scatterv(send, recv, counts(a, b), comm::ReduceOp::sum);
  }
  if (grad_.numel() > 0) ops::scale(grad_, 1.0f / static_cast<float>(group_.size()));
  square_sums();
}

// A parameter cut by a slice boundary is summed along the ranks in order: each rank continues
// the running sum the previous one hands it, so every parameter's sum is the sequence of
// additions a whole-tensor sum makes. The rank holding a parameter's last element has its sum;
// one all-gather gives every rank all of them.
void DenseShards::square_sums() {
  const int me = group_.rank(), R = group_.size();
  auto inside = [&](int64_t at) {  // a parameter straddles the flat position `at`
    for (size_t i = 0; i < params_.size(); ++i)
      if (offsets_[i] < at && at < offsets_[i + 1]) return true;
    return false;
  };
  Tensor carry = Tensor::zeros({1}, DType::i64);
  double running = 0;
  if (me > 0 && inside(mine_)) {
    group_.recv(carry, me - 1, kSquareSumTag);
    std::memcpy(&running, carry.data<int64_t>(), sizeof running);
  }
  const auto n = static_cast<int64_t>(params_.size());
  Tensor mine = Tensor::zeros({n}, DType::i64);
  for (const Piece& pc : pieces(mine_, mine_end_)) {
    const double s =
        add_squares(pc.param_offset > 0 ? running : 0.0,
                    grad_.rows(pc.flat_offset - mine_, pc.flat_offset - mine_ + pc.count));
    running = s;
    if (pc.param_offset + pc.count == pc.param->numel()) {
      const auto i = static_cast<int64_t>(std::find(params_.begin(), params_.end(), pc.param) -
                                          params_.begin());
      std::memcpy(mine.data<int64_t>() + i, &s, sizeof s);
    }
  }
  if (me + 1 < R && inside(mine_end_)) {
    std::memcpy(carry.data<int64_t>(), &running, sizeof running);
    group_.send(carry, me + 1, kSquareSumTag);
  }
  Tensor all = Tensor::empty({R * n}, DType::i64);
  group_.all_gather(mine, all);
  sums_.assign(params_.size(), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t last = offsets_[static_cast<size_t>(i) + 1] - 1;
    int owner = 0;
    while (end(owner) <= last) ++owner;
    std::memcpy(&sums_[static_cast<size_t>(i)], all.data<int64_t>() + owner * n + i,
                sizeof(double));
  }
}

double DenseShards::square_sum(const Param& p) const {
  MOE_CHECK(stage_ >= 2 && sums_.size() == params_.size(), "DenseShards::square_sum of '", p.name,
            "' before the gradients were reduce-scattered");
  const auto it = std::find(params_.begin(), params_.end(), &p);
  MOE_CHECK(it != params_.end(), "DenseShards: '", p.name, "' is not a sharded dense parameter");
  return sums_[static_cast<size_t>(it - params_.begin())];
}

void DenseShards::step(float lr, int64_t t, float clip) {
  if (stage_ >= 2 && clip != 1.0f && grad_.numel() > 0) ops::scale(grad_, clip);
  for (const Piece& pc : pieces(mine_, mine_end_)) {
    Param& p = *pc.param;
    const int64_t off = pc.flat_offset - mine_, n = p.numel();
    Tensor grad = stage_ >= 2
                      ? grad_.rows(off, off + pc.count)
                      : p.grad.reshape({n}).rows(pc.param_offset, pc.param_offset + pc.count);
    Tensor m = m_.rows(off, off + pc.count), v = v_.rows(off, off + pc.count);
    Tensor value = value_of(pc);
    const auto scalars = optim::adamw_scalars(config_, lr, t, p.decay);
    if (master_.defined()) {
      Tensor master = master_.rows(off, off + pc.count);
      optim::adamw_update(master, m, v, grad, scalars, &value);
    } else {
      optim::adamw_update(value, m, v, grad, scalars);
    }
  }
  // Stage 3: the slice is the value; the next gather() reads it. Otherwise every rank's updated
  // slice, bucket by bucket, into every rank's parameters.
  if (params_.empty() || stage_ >= 3) return;
  const DType dtype = dtype_;
  const Device device = device_;
  for (int64_t a = 0; a < total(); a += bucket_) {
    const int64_t b = std::min(total(), a + bucket_);
    const int64_t lo = std::max(a, mine_), hi = std::max(lo, std::min(b, mine_end_));
    Tensor send = Tensor::empty({hi - lo}, dtype, device);
    for (const Piece& pc : pieces(lo, hi))
      send.rows(pc.flat_offset - lo, pc.flat_offset - lo + pc.count)
          .copy_from(pc.param->value.reshape({pc.param->numel()})
                         .rows(pc.param_offset, pc.param_offset + pc.count));
    Tensor recv = Tensor::empty({b - a}, dtype, device);
    group_.all_gatherv(send, recv, counts(a, b));
    for (const Piece& pc : pieces(a, b))
      pc.param->value.reshape({pc.param->numel()})
          .rows(pc.param_offset, pc.param_offset + pc.count)
          .copy_from(recv.rows(pc.flat_offset - a, pc.flat_offset - a + pc.count));
  }
  for (Param* p : params_) p->refresh_compute();
}

std::vector<optim::OptimizerTensor> DenseShards::gather_state() const {
  std::vector<optim::OptimizerTensor> out;
  const std::vector<int64_t> all = counts(0, total());
  auto gather = [&](const Tensor& slice, const char* what) {
    Tensor whole = Tensor::empty({total()}, DType::f32, slice.device());
    group_.all_gatherv(slice, whole, all);
    for (size_t i = 0; i < params_.size(); ++i) {
      const Param* p = params_[i];
      out.push_back({str(what, ".", p->name),
                     whole.rows(offsets_[i], offsets_[i + 1]).reshape(p->shape), false, p});
    }
  };
  gather(m_, "adam.m");
  gather(v_, "adam.v");
  if (master_.defined()) gather(master_, "master");
  return out;
}

void DenseShards::load_state(const std::vector<optim::OptimizerTensor>& tensors) {
  std::map<std::string, const Tensor*> by_name;
  for (const optim::OptimizerTensor& t : tensors) by_name[t.name] = &t.tensor;
  std::vector<std::pair<const char*, Tensor*>> mine{{"adam.m", &m_}, {"adam.v", &v_}};
  if (master_.defined()) mine.emplace_back("master", &master_);
  for (const Piece& pc : pieces(mine_, mine_end_))
    for (auto [what, into] : mine) {
      const std::string name = str(what, ".", pc.param->name);
      auto it = by_name.find(name);
      MOE_CHECK(it != by_name.end(), "optimizer state: missing tensor '", name, "'");
      const Tensor& whole = *it->second;
      MOE_CHECK(whole.shape() == pc.param->shape && whole.dtype() == DType::f32,
                "optimizer state: ", whole.describe(), " does not match '", pc.param->name, "'");
      const int64_t off = pc.flat_offset - mine_;
      into->rows(off, off + pc.count)
          .copy_from(
              whole.reshape({pc.param->numel()}).rows(pc.param_offset, pc.param_offset + pc.count));
    }
}

void DenseShards::to(Device device) {
  for (Tensor* t : {&master_, &m_, &v_, &grad_, &values_})
    if (t->defined()) *t = t->to(device);
  device_ = device;
}

int64_t DenseShards::state_bytes() const {
  int64_t bytes = 0;
  for (const Tensor* t : {&master_, &m_, &v_, &grad_, &values_})
    if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  return bytes;
}

}  // namespace moe::parallel
