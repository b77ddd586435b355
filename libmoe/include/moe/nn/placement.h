// Dynamic expert placement for expert-parallel inference (Lina, ATC'23 §5): every rank of the
// expert group holds all E experts of every MoE layer, and a PlacementPolicy decides, for each MoE
// layer and batch, which ranks compute which expert's rows. A popular expert gets several ranks
// (replicas) that split its rows; unpopular ones share a rank. Which rank computes a row never
// changes its value: the layer's output is the same with any assignment.
//
// Shape letters: E experts of a layer, P ranks of the expert group, N tokens of one rank, k
// experts per token.
#pragma once
#include <cstdint>
#include <vector>

#include "moe/tensor.h"

namespace moe::nn {

struct ExpertAssignment {
  // replicas[e]: the ranks computing expert e's rows, distinct, at least one. Source rank s splits
  // its rows of e into n_e = replicas[e].size() contiguous chunks (split_rows) and sends chunk j
  // to replicas[e][(j + s) % n_e], so the rounding remainders land on different replicas.
  std::vector<std::vector<int32_t>> replicas;

  // The static layout of plain expert parallelism: expert e on rank e / (E/P).
  static ExpertAssignment contiguous(int64_t experts, int ranks);
  // Rows each rank computes when source rank s holds counts[s][e] rows of expert e (P x E),
  // following the chunking rule above.
  std::vector<int64_t> rank_rows(const std::vector<std::vector<int64_t>>& counts) const;
};

// Chunk j of n of `count` rows: [begin, begin + size) with begin = count*j/n (integer division).
inline int64_t split_begin(int64_t count, int64_t n, int64_t j) { return count * j / n; }

class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;
  // Called by the MoE layer of block `block` after its router ran on this rank's tokens, by every
  // rank of the expert group (it may be collective over it). topk_idx [N,k] i32: this rank's
  // tokens' choices; tokens_per_expert [E]: this rank's kept rows per expert. Must return the same
  // assignment on every rank of the group.
  virtual ExpertAssignment place(int64_t block, const Tensor& topk_idx,
                                 const std::vector<int32_t>& tokens_per_expert) = 0;
};

}  // namespace moe::nn
