// ZeRO for the dense parameters (--zero 1|2|3): their AdamW state, from stage 2 their reduced
// gradients, and at stage 3 their values and gradients too, sharded over the ranks that sum the
// dense gradients (the world). Expert parameters stay with their expert-parallel owners or the
// offload store; the sharded token table (--shard-embedding) is already split and stays out.
//
// The dense parameters, in ParamSet order, are laid end to end in one flat space of S elements;
// rank r of R owns the contiguous slice [S r / R, S (r + 1) / R) (balanced to one element,
// whatever the parameter boundaries). A step then:
//   stage 1: GradSync all-reduces every gradient as without ZeRO; this rank updates its slice;
//   stage 2: the dense gradients are reduce-scattered (in buckets of the flat space) into this
//            rank's slice instead, divided by R, and each parameter's sum of squares (for the
//            global norm) is computed along the slices in rank order, so it is the same double
//            a whole-tensor sum gives;
//   stage 3: as stage 2, and the values stay sharded: each parameter's storage exists only between
//            gather(group) and release(group), which the model calls around each block's forward
//            and backward (models/transformer.h, ParamHooks); the rank's slice is its master copy.
//            Its gradients exist from the backward gather to the release that reduce-scatters
//            them into the slice (the step's last micro-batch), so no rank holds a whole one;
// and then (stages 1 and 2) the updated values (storage dtype) are all-gathered so every rank
// holds the whole dense model again. AdamW is elementwise: a slice's update is bitwise the whole
// tensor's (optim::adamw_update), so stage 1 equals --zero 0 bitwise; stages 2 and 3 do too where
// the reduce-scatter adds in the all-reduce's order (always at 2 ranks; see docs/PERFORMANCE.md).
// Checkpoints stay logical: gather_state() gives whole tensors under AdamW's names.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/optim/adamw.h"
#include "moe/param.h"

namespace moe::parallel {

// One group's all-gather of stage 3, self-contained (it holds a reference to this rank's value
// slice and copies of the layout, nothing of its DenseShards), so that another thread may run it
// over its own communicator while compute goes on (parallel::ZeroPrefetch), and outlive the
// shards if it must. The same collectives, in the same order, as DenseShards::gather(g).
struct GatherJob {
  Tensor slice;                                     // this rank's values (storage dtype)
  int64_t mine = 0;                                 // the slice's first flat position
  std::vector<std::pair<int64_t, int64_t>> ranges;  // the group's runs, flat [begin, end)
  std::vector<int64_t> bounds;                      // [R + 1]: each rank's slice start, then S
  int64_t bucket = 1;                               // elements per collective
  DType dtype = DType::f32;
  Device device;
  // One buffer per run, gathered over `comm` (this group's ranks in the same order).
  std::vector<Tensor> run(comm::Communicator& comm) const;
};

class DenseShards {
 public:
  // The parameters ZeRO shards: resident, neither experts nor slices of a logical tensor.
  static bool shardable(const Param& p);

  // Which gather group a parameter belongs to (stage 3): a block's index, or -1.
  using GroupOf = std::function<int64_t(const Param&)>;

  // stage 1, 2 or 3 over `group` (every rank of it holds the same dense parameters). Allocates
  // this rank's slice of the fp32 masters (bf16/f16 parameters), Adam moments, (stage 2 and 3)
  // gradient and (stage 3) values; stage 3 then releases every covered parameter's value and
  // compute copy (Param::value undefined until gather()).
  // `bucket_bytes`: the largest piece of the flat space one collective moves (its send and
  // receive buffers are the transient memory of a step: small, unlike a whole-space buffer,
  // at the price of one collective per bucket). `params` and
  // `group` must outlive this object.
  DenseShards(comm::Communicator& group, ParamSet& params, int stage,
              const optim::AdamWConfig& config, int64_t bucket_bytes = 2 << 20,
              const GroupOf& group_of = nullptr);

  int stage() const { return stage_; }
  bool covers(const Param& p) const;
  int64_t total() const { return offsets_.empty() ? 0 : offsets_.back(); }  // S
  int64_t begin(int rank) const;  // the flat slice of `rank`
  int64_t end(int rank) const { return begin(rank + 1); }

  // Stage 2: reduce-scatters the covered gradients into this rank's slice and divides it by the
  // group's size, then computes every covered parameter's sum of squares (collective). Stage 1:
  // nothing (GradSync reduced them whole).
  void reduce_gradients();
  // Stage 2, after reduce_gradients(): p's share of the squared global norm, bitwise
  // optim::grad_square_sum of the whole reduced gradient on the CPU.
  double square_sum(const Param& p) const;

  // Updates this rank's slice (update number `t`, learning rate lr) and all-gathers the values
  // (collective). `clip`: the clip factor of the step; stage 2 applies it to its gradient slice
  // (stage 1's gradients are the parameters', already scaled by optim::clip_gradients).
  void step(float lr, int64_t t, float clip);

  // Stage 3: materialise the values of every covered parameter of gather group `g` (an
  // all-gather each; collective, every rank the same groups in the same order), and drop them.
  // Groups already gathered are left alone. For backward, `with_grads` gives the group's
  // parameters zeroed gradients where they have none, and `reduce_grads` (the step's last
  // micro-batch) reduce-scatters them into the slice and drops them, so no rank holds the whole
  // dense gradient either. gather_all / release_all: every group, values only.
  void gather(int64_t g, bool with_grads = false);
  void release(int64_t g, bool reduce_grads = false);
  void gather_all();
  void release_all();
  // gather(g) in two halves, for a prefetch: job(g) describes the all-gather (run it on any
  // thread, over this group's communicator or a duplicate of it, before the next step()), and
  // install(g, values) makes its buffers the parameters' values as gather(g) would (a group
  // already gathered keeps its own and only gets gradients).
  GatherJob job(int64_t g) const;
  void install(int64_t g, std::vector<Tensor> values, bool with_grads = false);
  bool gathered(int64_t g) const;
  // Stage 3: every covered parameter's value, whole, in its storage dtype (collective), and this
  // rank's slice of them from whole tensors by parameter name (a missing one throws, named).
  std::vector<std::pair<std::string, Tensor>> gather_values() const;
  void load_values(const std::map<std::string, Tensor>& whole);

  // Every covered parameter's optimizer tensors, whole ("adam.m.<p>", "adam.v.<p>", and
  // "master.<p>" for 16-bit parameters), gathered on every rank (collective).
  std::vector<optim::OptimizerTensor> gather_state() const;
  // Takes this rank's slice of the whole tensors gather_state() names; throws naming a missing
  // or mis-shaped one.
  void load_state(const std::vector<optim::OptimizerTensor>& tensors);
  // The state tensors follow the parameters to `device`.
  void to(Device device);
  // Bytes of sharded state this rank holds (masters, moments, gradient and value slices).
  int64_t state_bytes() const;

 private:
  struct Piece {  // the part of one parameter inside a range of the flat space
    Param* param;
    int64_t param_offset, flat_offset, count;
  };
  std::vector<Piece> pieces(int64_t begin, int64_t end) const;
  Tensor value_of(const Piece& pc) const;  // where the piece's value is updated (stage 3: slice)
  const std::vector<std::pair<size_t, size_t>>& runs_of(int64_t g) const;
  void square_sums();           // stage 2: sums_ along the slices in rank order
  void reduce_param(size_t i);  // stage 3: one parameter's gradient into the slice
  void reduce_range(int64_t begin, int64_t end, const Tensor& flat);  // stage 3 gradients
  std::vector<int64_t> counts(int64_t begin, int64_t end) const;      // overlap with each rank

  comm::Communicator& group_;
  int stage_;
  optim::AdamWConfig config_;
  int64_t bucket_;                // elements
  std::vector<Param*> params_;    // covered, ParamSet order
  std::vector<int64_t> offsets_;  // [params_.size() + 1]: each one's start in the flat space
  int64_t mine_ = 0, mine_end_ = 0;
  Tensor master_, m_, v_, grad_;  // [mine_end_ - mine_]; master_ only for 16-bit parameters
  Tensor values_;                 // stage 3: this slice's values (storage dtype)
  DType dtype_;                   // the parameters' storage dtype
  Device device_;
  std::vector<double> sums_;          // stage 2 and 3: per covered parameter
  std::vector<int64_t> group_of_;     // stage 3: per covered parameter
  std::map<int64_t, bool> gathered_;  // stage 3: group -> materialised now
  // Stage 3: per group, its runs of consecutive covered parameters [first, last), and the
  // gradient buffer of each run while backward fills it.
  std::map<int64_t, std::vector<std::pair<size_t, size_t>>> runs_;
  std::map<int64_t, std::vector<Tensor>> grad_buffers_;
};

}  // namespace moe::parallel
