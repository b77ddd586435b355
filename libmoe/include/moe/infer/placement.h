// Lina's popularity-aware expert placement for expert-parallel inference (ATC'23 §5), as an
// nn::PlacementPolicy (moe/nn/placement.h): every rank holds all experts, and for each MoE layer
// and batch
//   phase 1: each token's path (its first-choice experts at the previous path_length MoE layers of
//     this batch) picks a distribution over the layer's experts from the path table
//     (moe-profile paths; unseen paths and the first MoE layer use the layer's marginal); the mean
//     over the batch's tokens (all ranks) is the estimated popularity p_e;
//   placement: balance::pack_experts (moe/balance/placement.h) packs replicas of the experts by
//     that popularity onto the R ranks;
//   phase 2: after the router ran, if an expert among the actual top-2k (by the batch's global
//     load, experts without rows left out) is not among the estimated top-2k, the placement is
//     re-planned from the actual loads.
// The plan is computed from integers all-gathered over the group, so every rank computes the same.
// Shape letters: E experts of a layer, R ranks, L MoE layers, k experts per token.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/models/config.h"
#include "moe/nn/placement.h"
#include "moe/profile/paths.h"

namespace moe::infer {

// Max over ranks of the rows a rank computes, over their mean (1 = perfect balance; 1 also when
// no rows: unlike balance::max_over_mean, which says 0, and is computed in another order).
double max_over_mean(const std::vector<int64_t>& rank_rows);

// Per MoE layer, over the batches seen so far.
struct PlacementLayerStats {
  int64_t block = 0, batches = 0;
  int64_t replans = 0;                 // phase 2 re-planned (actual top-2k != estimated)
  double static_max_over_mean = 0;     // mean over batches: the contiguous layout E/R per rank
                                       // (NaN when R does not divide E)
  double estimated_max_over_mean = 0;  // mean over batches: the phase-1 plan on the actual rows
  double placed_max_over_mean = 0;     // mean over batches: the plan used (after phase 2)
  double mean_max_replicas = 0;        // mean over batches of the largest n_e
};

class LinaPlacement : public nn::PlacementPolicy {
 public:
  // Throws moe::Error when the table does not describe this model (MoE layers, experts per
  // layer, top-k): "the path table was built for ...". group: the expert-parallel ranks.
  LinaPlacement(profile::PathTable table, const ModelConfig& config, comm::Communicator& group);

  nn::ExpertAssignment place(int64_t block, const Tensor& topk_idx,
                             const std::vector<int32_t>& tokens_per_expert) override;

  std::vector<PlacementLayerStats> stats() const;

 private:
  profile::PathTable table_;
  comm::Communicator& group_;
  int64_t top_k_ = 1;
  std::vector<int64_t> moe_of_block_;  // block -> MoE layer index (-1: dense)
  // This batch's first choices per MoE layer so far ([layer][token]); reset at the first MoE
  // layer of every forward pass.
  std::vector<std::vector<int32_t>> first_choice_;
  std::vector<PlacementLayerStats> stats_;
};

}  // namespace moe::infer
