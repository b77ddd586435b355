// Completing the gradients across ranks after backward (data and expert parallelism): which
// parameter reduces over which group of the Layout, packed into one fused buffer per group, and
// with Lina's priority scheduler reduced in --partition-mb micro-ops while backward goes on.
//
//   dense parameters        summed over the world;
//   expert parameters (P>1) summed over their W/P replicas (the ranks holding the same experts);
//   the sharded token table already complete (its backward summed it over the world);
//   dense parameters under --zero 2: reduce-scattered into each rank's slice (DenseShards);
//   whole expert tensors under a placement policy: over the world (lpt: every rank keeps every
//   expert current), or, once set_expert_holders() names each expert's replicas (FlexMoE), each
//   expert's rows over its holders only, expert by expert in ascending id, layer by layer.
//
// Every gradient is then divided by W: a rank's gradients carry its local mean's 1/(B/W), so the
// result is the gradient of the global batch's mean loss. The order of parameters inside a buffer
// is the packing order (backward order), the same on every rank, so the sums are too.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "moe/optim/adamw.h"
#include "moe/parallel/layout.h"
#include "moe/param.h"
#include "moe/tensor.h"

namespace moe::parallel {

class DenseShards;

class GradSync {
 public:
  // How a parameter's gradient is completed across ranks.
  // All ranks / expert replicas / already complete / each expert's holders (set_expert_holders) /
  // reduce-scattered into ZeRO's slices (set_dense_shards, stage 2).
  enum class Reduce { world, replicas, none, holders, sharded };

  // Sizes the fused buffers for `params` (host memory; to() moves them). For layouts of W > 1
  // ranks; `layout` and `params` must outlive this object.
  GradSync(Layout& layout, const ParamSet& params);

  Reduce reduce_of(const Param& p) const;
  // Copies the gradients into the fused buffers, in the order given (backward order). With the
  // scheduler, every whole --partition-mb of packed gradients is submitted at once.
  void pack(std::span<Param* const> params);
  // Completes the reduction of everything packed since the last call and averages every gradient
  // of `params` over the world.
  void finish(ParamSet& params);
  // L2 norm of the whole model's gradient: replicated parameters counted once, expert shards
  // summed over the expert-parallel group, the sharded table over the world. Collective.
  // Offloaded expert parameters (Param::offloaded) count through `offloaded`; their store
  // averages them (finish() leaves them alone) and they have no replicas to reduce over.
  double global_norm(const ParamSet& params, const optim::OffloadedSquareSum& offloaded = {}) const;
  // The fused buffers follow the gradients to `device`.
  void to(Device device);
  // ZeRO (--zero): at stage 2 the parameters `shards` covers leave the world buffer; finish()
  // reduce-scatters them into its slices and global_norm() takes their sums of squares from it.
  // Stage 1 changes nothing here. `shards` must outlive this object (null: none).
  void set_dense_shards(DenseShards* shards);

  // FlexMoE's replicas (--placement flexmoe, one expert group = the world): `params` are one MoE
  // layer's expert tensors on this rank (its vExpert slots, [V, ...]), holders[e] the ranks
  // (ascending) holding a replica of expert e, and row[e] the row of `params` holding it here
  // (-1: not held here). From now on their gradients sum over each expert's holders only (no
  // message for an expert with one holder), and the norm counts each expert once (on its first
  // holder). Collective over the expert group: every rank calls it with the same holders, in the
  // same order; a replica group not seen before is split off then.
  void set_expert_holders(std::span<Param* const> params,
                          const std::vector<std::vector<int32_t>>& holders,
                          const std::vector<int32_t>& row);

 private:
  void submit(int group, int64_t elements);  // the next packed elements, to the scheduler
  void reduce_held();                        // each expert's rows over its holders

  struct HeldLayer {
    std::vector<Param*> params;
    std::vector<std::vector<int32_t>> holders;  // [E]
    std::vector<int32_t> row;                   // [E] this rank's row of each expert, or -1
  };
  std::vector<HeldLayer> held_;             // in the order first set: the reduction order
  std::map<const Param*, size_t> held_of_;  // param -> its layer in held_
  // The sub-communicator of each replica group seen (null on ranks outside it).
  std::map<std::vector<int32_t>, std::unique_ptr<comm::Communicator>> groups_;

  void size_buffers(Device device);  // buffer_ for the current reductions, on `device`

  Layout& layout_;
  const ParamSet& params_;
  DenseShards* shards_ = nullptr;
  // Gradients fused for their reduction: [0] over the world, [1] over the expert replicas; the
  // parameters packed this step with their offsets, in packing (backward) order.
  Tensor buffer_[2];
  int64_t fill_[2] = {0, 0}, sent_[2] = {0, 0};
  std::vector<std::pair<Param*, int64_t>> packed_[2];
};

}  // namespace moe::parallel
