// Dynamic expert placement for expert-parallel inference (Lina, ATC'23 §5): every rank of the
// expert group holds all E experts of every MoE layer, and a PlacementPolicy decides, for each MoE
// layer and batch, which ranks compute which expert's rows (an ExpertAssignment,
// moe/balance/placement.h). A popular expert gets several ranks (replicas) that split its rows;
// unpopular ones share a rank. Which rank computes a row never changes its value: the layer's
// output is the same with any assignment.
//
// Shape letters: E experts of a layer, P ranks of the expert group, N tokens of one rank, k
// experts per token.
#pragma once
#include <cstdint>
#include <vector>

#include "moe/balance/placement.h"
#include "moe/tensor.h"

namespace moe::nn {

// The assignment type and the policies themselves live in balance/ (one home for placement).
using balance::ExpertAssignment;
using balance::split_begin;

class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;
  // Called by the MoE layer of block `block` after its router ran on this rank's tokens, by every
  // rank of the expert group (it may be collective over it). topk_idx [N,k] i32: this rank's
  // tokens' choices; tokens_per_expert [E]: this rank's kept rows per expert. Must return the same
  // assignment on every rank of the group.
  virtual ExpertAssignment place(int64_t block, const Tensor& topk_idx,
                                 const std::vector<int32_t>& tokens_per_expert) = 0;
  // The experts whose state this rank stores for block `block` of `experts`, one per row of the
  // layer's expert tensors (FlexMoE's vExpert slots; -1: an empty slot), when the policy keeps
  // only some; empty (the default): every rank stores all E in expert order. Then place() must
  // give ExpertAssignment::held_index.
  virtual std::vector<int64_t> held_rows(int64_t block, int64_t experts) const {
    (void)block;
    (void)experts;
    return {};
  }
};

}  // namespace moe::nn
