// Expert placement policies, in one place: which ranks hold (or compute) which experts of a MoE
// layer. Pure functions of loads and counts, no communication, so every rank that feeds them the
// same integers gets the same placement.
//
// One placement type, ExpertAssignment: every expert's replicas (the ranks computing its rows).
// A static placement has one replica per expert and is also written as an expert -> rank map
// (std::vector<int>, map[e] = rank), the form checkpoints record in /sharding expert_rank.
//
// Policies:
//   contiguous   expert e on rank e / (E/N)   the trainer's layout of plain expert parallelism
//   round robin  expert e on rank e mod N
//   LPT          Graham's longest-processing-time rule over profiled loads (ES-MoE), E/N per rank;
//                per batch without a cap, over compute + upload times (lpt_batch_placement)
//   Lina         popularity-weighted replicas packed first-fit-decreasing (ATC'23 §5); the
//                path-table estimate and its two phases are infer::LinaPlacement's
//
// Shape letters: E experts of a layer, N (or P) ranks.
#pragma once
#include <cstdint>
#include <vector>

namespace moe::balance {

struct ExpertAssignment {
  // replicas[e]: the ranks computing expert e's rows, distinct, at least one. Source rank s splits
  // its rows of e into n_e = replicas[e].size() contiguous chunks (split_rows) and sends chunk j
  // to replicas[e][(j + s) % n_e], so the rounding remainders land on different replicas.
  std::vector<std::vector<int32_t>> replicas;
  // Optional explicit split (FlexMoE's flexible routing): rows[e][j] is how many of this rank's
  // rows of e go to replicas[e][j], taken in replica order as contiguous chunks; they sum to this
  // rank's rows of e. Empty: the even chunking above. Per rank, unlike `replicas`.
  std::vector<std::vector<int64_t>> rows;
  // Optional (FlexMoE's vExpert slots): held_index[p][e] is the row of rank p's expert tensors
  // that holds expert e (-1: p does not hold it). Empty: rank p stores every expert in expert
  // order (placed) or its contiguous share (static).
  std::vector<std::vector<int32_t>> held_index;

  // The static layout of plain expert parallelism: expert e on rank e / (E/P).
  static ExpertAssignment contiguous(int64_t experts, int ranks);
  // Rows each rank computes when source rank s holds counts[s][e] rows of expert e (P x E),
  // following the chunking rule above.
  std::vector<int64_t> rank_rows(const std::vector<std::vector<int64_t>>& counts) const;
};

// Chunk j of n of `count` rows: [begin, begin + size) with begin = count*j/n (integer division).
inline int64_t split_begin(int64_t count, int64_t n, int64_t j) { return count * j / n; }

// ---- static placements: expert -> rank maps ---------------------------------------------------

// Experts per rank when `ranks` hold a layer of `experts` in equal shares (UsageError otherwise).
int64_t per_rank(int64_t experts, int ranks);

// Experts -> ranks for one MoE layer: map[e] is the rank holding expert e. Every rank holds E/N
// experts (N must divide E, else UsageError).
std::vector<int> contiguous_placement(int64_t experts, int ranks);  // e -> e / (E/N): the trainer's
std::vector<int> round_robin_placement(int64_t experts, int ranks);  // e -> e mod N
// Graham's LPT rule with equal capacities: experts by load descending (ties: lower id first), each
// to the least-loaded rank that still has room for one of its E/N experts (ties: lower rank).
std::vector<int> lpt_placement(const std::vector<int64_t>& loads, int ranks);
// ES-MoE's per-batch placement (issue 17): every expert of the batch to one rank by Graham's LPT,
// no per-rank cap. Expert e's processing time on rank r is
//   p_e(r) = combine(compute_s[e], resident[e] == r ? 0 : upload_s[e]),
// combine = max (the upload overlaps compute) or sum (it does not). Experts are taken by
// p_e = combine(compute_s[e], upload_s[e]) descending (ties: lower id) and each goes to the rank
// where it finishes first, load_r + p_e(r) (ties: lower rank). With no expert resident that is
// Graham's rule exactly: the least-loaded rank, and a makespan within 4/3 - 1/(3R) of optimal.
enum class UploadOverlap { max, sum };
struct BatchLptInput {
  std::vector<double> compute_s;  // [E] seconds to compute e's tokens of this batch (>= 0)
  std::vector<double> upload_s;   // [E] seconds to bring e's state to a rank (>= 0)
  std::vector<int> resident;      // [E] the rank already holding e, -1 none; empty: none resident
  UploadOverlap overlap = UploadOverlap::sum;
};
struct BatchLptPlacement {
  std::vector<int> rank_of_expert;  // [E]
  std::vector<double> rank_s;       // [N] the sum of p_e(r) of the experts placed on rank r
  double makespan_s = 0;            // max_r rank_s[r]
};
double processing_s(double compute_s, double upload_s, UploadOverlap overlap);
BatchLptPlacement lpt_batch_placement(const BatchLptInput& input, int ranks);

// Sum of the loads of each rank's experts ([N]).
std::vector<int64_t> rank_loads(const std::vector<int64_t>& loads, const std::vector<int>& map,
                                int ranks);
// max over mean of rank_loads (1 = balanced; 0 when there is no load).
double max_over_mean(const std::vector<int64_t>& rank_loads);
bool is_contiguous_placement(const std::vector<int>& map, int ranks);

// ---- replicated placement (Lina) --------------------------------------------------------------

// Lina's packing step: popularity [E] (any non-negative weights; all zero = uniform) onto `ranks`
// ranks. Expert e gets n_e = max(1, round(R p_e)) replicas (at most R), each carrying p_e / n_e;
// the pieces are packed first-fit-decreasing into R ranks of capacity 1/R (replicas of one expert
// on distinct ranks; a piece that fits nowhere goes to the least-loaded rank).
ExpertAssignment pack_experts(const std::vector<double>& popularity, int ranks);

}  // namespace moe::balance
