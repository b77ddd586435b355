// Start-up profiling for FlexMoE's cost model (issue 17): measures the numbers CostModel
// (moe/balance/flexmoe.h) holds on the ranks of one expert-parallel group, once, before training,
// so that make_plan's step-time estimates (eqs. 5, 7-9) use this machine's rates.
//
// Shape letters: R ranks of the group, D model width, F expert hidden width, n probe tokens.
//
// What is measured, and the rules for the fields that are not measured:
// - gemm_tokens_per_s[r]: rank r runs one expert's forward and backward on n random tokens with
//   the ops the MoE layer runs (ops::grouped_gemm, expert_activation(_backward),
//   grouped_gemm_weight_grad: three GEMMs per weight matrix, w1 w2 and w3 when gated), one warm-up
//   pass first, then `repeats` timed passes per probe count; a probe's rate is n / the median
//   seconds. The rank's rate is the one at the largest probe (the size the planner's batches
//   approach; small probes pay per-call overheads). All-gathered.
// - bandwidth[a*R + b]: a round-robin (circle) schedule of pairs, every rank in at most one pair
//   per round, every rank walking the rounds in the same order; in pair (a, b), a < b, rank a
//   sends `bandwidth_bytes` to b and b sends them back (isend/irecv), one warm-up round trip, then
//   `repeats` timed ones; bytes / (fastest round trip / 2) is the one-way rate, set for both
//   directions (a ping-pong cannot tell them apart). The diagonal is 0 (local tokens are free).
//   Each pair's rate is what its lower rank measured, all-gathered.
// - allreduce_bytes_per_s[g], g = 2..R: the first g ranks (a split of the group; the others wait
//   at the next collective) all-reduce grad_bytes_per_expert bytes of f32, one warm-up, then
//   `repeats` timed ones, each after a barrier of the g ranks; bytes / rank 0's fastest seconds,
//   broadcast from rank 0. Entries 0 and 1 are 0 (a single replica needs no sync).
// - bytes_per_token = D * dtype_bytes (one activation row of the exchange).
// - parameters P = F * D * (3 when gated: w1, w3, w2; else 2: w1, w2); biases are left out (they
//   are F + D of the (2 or 3) F D, below 1% at the widths that matter).
// - grad_bytes_per_expert = P * 4: gradients are reduced in fp32 whatever the parameter dtype.
// - state_bytes_per_expert = P * 12: what Expand copies is the fp32 master value and Adam's fp32
//   m and v; a bf16/f16 working copy is the rounded master, so the receiver rounds it again
//   instead of receiving it (dtype_bytes does not enter).
// Every rank returns the same CostModel, bit for bit: each rank's measurements travel as their
// 64-bit patterns through all-gather / broadcast, and every rank assembles them in rank order.
// One process (group null or of size 1): no communication, bandwidth {0}, allreduce rates {0, 0},
// and CostModel::validate(1) passes.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "moe/balance/flexmoe.h"
#include "moe/comm/communicator.h"
#include "moe/device.h"

namespace moe::balance {

struct CostProfileSpec {
  int64_t d_model = 0, d_ff = 0;  // one expert's shapes
  bool gated = false;             // SwiGLU experts (w1, w3, w2) vs two-matrix GELU MLP (w1, w2)
  int64_t dtype_bytes = 4;        // bytes per activation / parameter element
  std::vector<int64_t> token_counts = {64, 256, 1024};  // GEMM probe sizes
  int64_t bandwidth_bytes = 1 << 20;                    // message size for the pairwise probe
  // Timings per probe: the GEMM rate is the median's, the bandwidths and all-reduce rates the
  // fastest try's (a descheduled rank only ever slows a transfer down).
  int repeats = 5;
  // Where the expert GEMMs run (the training's device). The GPU is synchronised around each timed
  // pass, so a rate includes the kernels, not only their launches.
  Device device = {};
  // Where the communication probes' buffers live: cpu for MPI and local communicators, the rank's
  // GPU for NCCL (host buffers would be staged through the device, and the staging timed).
  Device comm_device = {};

  // Throws UsageError naming the first field out of range: d_model, d_ff, dtype_bytes,
  // token_counts (empty, or a count < 1), bandwidth_bytes, repeats.
  void validate() const;
};

struct CostProfile {
  CostModel model;  // every field filled, valid for group.size() ranks
  std::vector<std::pair<int64_t, double>> gemm_points;  // this rank's (tokens, tokens/s) probes
  double seconds = 0;                                   // how long profiling took on this rank
};

// Collective over `group` (null or size 1: one rank, no communication); every rank must pass the
// same spec (checked: a rank whose spec differs ends every rank with moe::Error naming it).
CostProfile profile_costs(comm::Communicator* group, const CostProfileSpec& spec);

// A few human lines: GEMM rate per rank, the bandwidth matrix in GB/s, the all-reduce rate per
// group size, the byte sizes. No trailing newline.
std::string describe(const CostModel& m);
// For the run's metrics: {"ranks", "gemm_tokens_per_s" [R], "bandwidth_bytes_per_s" [R][R] (row
// from, column to), "allreduce_bytes_per_s" [R+1], "bytes_per_token", "grad_bytes_per_expert",
// "state_bytes_per_expert"}.
nlohmann::json to_json(const CostModel& m);
// The model to_json wrote, bit for bit (JSON keeps a double's 17 significant digits); throws
// moe::Error naming the key that is missing or of the wrong type.
CostModel cost_model_from_json(const nlohmann::json& j);
// to_json(profile.model) plus "gemm_points" [[tokens, tokens/s], ...] and "seconds" (this rank's).
nlohmann::json to_json(const CostProfile& profile);

}  // namespace moe::balance
