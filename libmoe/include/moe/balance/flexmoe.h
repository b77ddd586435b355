// FlexMoE's planning core (SIGMOD'23, issue 17): the vExpert map of one MoE layer, flexible
// routing of tokens to replicas (Alg. 3), the step-time cost model (eqs. 5, 7-9) and the greedy
// policy maker (Expand, Shrink, Migrate). Pure functions of integers and profiled rates, no
// communication: every rank that feeds them the same all-gathered token counts computes the same
// plan, bit for bit: routing and the choice of experts and ranks use integers only, all ties are
// broken by index, and the few floating-point decisions (is t1 < t0, which migrate is cheapest)
// are the same expressions over the same inputs in the same order on every rank (as long as every
// rank runs the same build; otherwise broadcast rank 0's plan).
//
// Shape letters: R ranks of the expert-parallel group, V vExpert slots per rank, E logical experts
// of the layer. Token matrix I [R][E]: I[s][e] = tokens source rank s sends to expert e (after the
// router's top-k, so a token routed to k experts counts k times).
//
// Replicas of one expert on one rank are forbidden: a rank's expert GEMM rate is the rank's, so a
// second replica on the same rank adds no capacity, only a slot that another expert could use.
// Every expert therefore has n_e = number of ranks holding it, 1 <= n_e <= R.
#pragma once
#include <cstdint>
#include <vector>

#include "moe/balance/placement.h"

namespace moe::balance {

// I[s][e]: tokens source rank s routes to expert e ([R][E], every entry >= 0).
using TokenMatrix = std::vector<std::vector<int64_t>>;

// ---- the vExpert map --------------------------------------------------------------------------

class VExpertMap {
 public:
  static constexpr int32_t kEmpty = -1;

  // R ranks x V slots, all empty (not yet valid: every expert needs a replica).
  VExpertMap(int ranks, int slots_per_rank, int64_t experts);
  // Plain expert parallelism in vExpert form: expert e in slot e mod ceil(E/R) of rank
  // e / ceil(E/R); the remaining slots stay empty. Needs R*V >= E.
  static VExpertMap contiguous(int ranks, int slots_per_rank, int64_t experts);
  // From explicit slots: slots[r*V + v] = expert or kEmpty. Validated (see validate()).
  static VExpertMap from_slots(int ranks, int slots_per_rank, int64_t experts,
                               std::vector<int32_t> slots);

  int ranks() const { return ranks_; }
  int slots_per_rank() const { return slots_per_rank_; }
  int64_t experts() const { return experts_; }
  const std::vector<int32_t>& slots() const { return slots_; }
  int32_t slot(int rank, int v) const;

  bool holds(int rank, int64_t expert) const;
  // The ranks holding expert e, ascending (the replica group; its gradients all-reduce together).
  std::vector<int32_t> holders(int64_t expert) const;
  int64_t replicas(int64_t expert) const;  // n_e
  int free_slots(int rank) const;

  // Put a replica of `expert` in the first empty slot of `rank` (Error: no free slot, or the rank
  // already holds it). Remove the replica of `expert` on `rank` (Error: the rank does not hold it,
  // or it is the last replica).
  void add_replica(int rank, int64_t expert);
  void remove_replica(int rank, int64_t expert);

  // Throws moe::Error naming the first broken rule: slot values in [-1, E), an expert held twice
  // on one rank, an expert without a replica.
  void validate() const;
  // The same placement as balance's ExpertAssignment (replicas[e] = holders(e)).
  ExpertAssignment assignment() const;

  bool operator==(const VExpertMap&) const = default;

 private:
  int ranks_;
  int slots_per_rank_;
  int64_t experts_;
  std::vector<int32_t> slots_;  // [R*V]
};

// ---- flexible routing (Alg. 3) ----------------------------------------------------------------

// route.at(s, e, d): tokens source s sends to the replica of e on rank d ([R][E][R], flat).
struct FlexRoute {
  int ranks = 0;
  int64_t experts = 0;
  std::vector<int64_t> counts;

  int64_t at(int src, int64_t expert, int dst) const;
  // Tokens rank `src` sends to each rank for all experts ([R]; the all-to-all's send counts).
  std::vector<int64_t> send_counts(int src) const;
  // Tokens each rank processes, summed over sources and experts ([R]: load_g of eq. 6).
  std::vector<int64_t> rank_tokens() const;
};

// Alg. 3 with its sign errors corrected. For each expert e with I_e = sum_s I[s][e] tokens and
// n_e holders:
//  1. quota: every holder takes I_e / n_e tokens; the I_e mod n_e leftover tokens go one each to
//     the holders with the most local tokens I[h][e] (ties: lower rank). Quotas sum to I_e.
//  2. keep: a holder source keeps min(I[s][e], quota_s) tokens on its own replica.
//  3. overflow: what a source does not keep, o_s = I[s][e] - kept (all of it for a non-holder),
//     is split over the holders' spare capacity spare_h = quota_h - kept_h in proportion:
//     x[s][h] = o_s * spare_h / O, O = sum_s o_s = sum_h spare_h.
//  4. rounding: floor every x[s][h]; the units each row and column still miss go, one per cell,
//     to the cells with the largest remainders (ties: lower source, then lower holder), skipping a
//     cell whose row or column is complete; when that greedy pass stalls, augmenting paths (rows
//     and columns visited in index order) move units between cells with a remainder until every
//     row sums to o_s and every column to spare_h. Such a rounding always exists (an integer
//     matrix rounding of a matrix with integer margins).
// So: every count is an integer, source s sends exactly I[s][e], every replica ends at exactly its
// quota, and the answer depends only on the integers given.
FlexRoute flexible_route(const VExpertMap& map, const TokenMatrix& tokens);

// ---- the cost model (eqs. 5, 7-9) -------------------------------------------------------------

// Profiled numbers, all positive where used.
struct CostModel {
  std::vector<double> gemm_tokens_per_s;      // [R] expert GEMM rate of each rank (fwd + bwd)
  std::vector<double> bandwidth;              // [R*R] bytes/s, bandwidth[a*R + b] from a to b;
                                              // the diagonal is unused (local tokens are free)
  std::vector<double> allreduce_bytes_per_s;  // [R+1] by replica-group size g (g = 2..R used)
  double bytes_per_token = 0;                 // one token's activation row (D * dtype size)
  double grad_bytes_per_expert = 0;           // one expert's gradients (the replica all-reduce)
  double state_bytes_per_expert = 0;          // parameters + optimizer state (what Expand copies)

  double link(int from, int to) const;  // bandwidth[from*R + to]
  // Throws UsageError naming the first field that is missing, wrong-sized or not positive.
  void validate(int ranks) const;
};

// Predicted seconds of one training step of the layer, per rank and overall.
struct StepEstimate {
  std::vector<double> compute_s;  // [R] tokens processed / gemm_tokens_per_s[r]          (eq. 7)
  std::vector<double> a2a_s;      // [R] sum over peers p != r of 4 * route(p -> r) tokens *
                                  //     bytes_per_token / bandwidth(p, r)                  (eq. 8)
  std::vector<double> sync_s;     // [R] sum over experts e held by r with n_e > 1 of
                                  //     grad_bytes_per_expert / allreduce_bytes_per_s[n_e] (eq. 9)
  std::vector<double> total_s;    // [R] compute + a2a + sync
  double step_s = 0;              // max_r total_s[r]                                     (eq. 5)
  int straggler = 0;              // argmax (ties: lower rank)
};

// The 4 exchanges are dispatch and combine, forward and backward: a token that rank p routes to a
// replica on rank r crosses the p-r link four times. FlexMoE charges each vExpert for the tokens
// it processes, so the exchanges are charged to the processing rank r.
StepEstimate estimate_step(const VExpertMap& map, const FlexRoute& route, const CostModel& cost);
// Seconds to copy one expert's state from rank `from` to rank `to`: state bytes / bandwidth.
double adjustment_s(const CostModel& cost, int from, int to);

// ---- the policy maker (greedy Expand + Shrink, Migrate)
// ------------------------------------------------

struct PolicyOptions {
  double threshold = 1.1;  // replan while max_g load_g / mean_g load_g (eq. 6) is above this
  int max_steps = 0;       // at most this many moves (Expand(+Shrink) or Migrate); 0 = R*V
  bool migrate = true;     // try Migrate when no Expand pays (see make_plan)
};

struct PlanAction {
  // expand: copy parameters and optimizer state from `from` into a free slot of `rank`.
  // shrink: drop the replica of `expert` on `rank` (its slot is then free for an expand).
  // migrate: the same change as shrink (drop the replica on `rank`), chosen for the sync cost:
  //   the replica is merged into the other holders, which take its tokens.
  enum class Kind { expand, shrink, migrate };
  Kind kind;
  int64_t expert;
  int rank;           // where the replica is added (expand) or dropped (shrink)
  int from = -1;      // expand: the holder whose parameters and optimizer state are copied
  double cost_s = 0;  // adjustment_s for expand, 0 for shrink (a dropped replica costs nothing)
};

struct Plan {
  VExpertMap map;  // the map after every applied action
  // In order; a move is an expand (after its shrink when no slot was free) or a migrate.
  std::vector<PlanAction> actions;
  std::vector<double> step_s;   // predicted step time: [0] before, then after each move
  std::vector<double> balance;  // balance ratio (eq. 6): [0] before, then after each move
  double adjustment_s = 0;      // sum of the actions' cost_s
};

// The balance ratio of eq. 6 over ranks: max_g load_g / mean_g load_g (0 when there is no load).
double balance_ratio(const FlexRoute& route);

// Greedy, as FlexMoE's policy maker: while the balance ratio is above the threshold,
//   t0 = the current step time; e0 = argmax_e I_e / n_e (ties: lower id);
//   target = among ranks not holding e0, the least-loaded (tokens under the current routing; ties:
//            lower rank) with an empty slot; when no such rank has one, e1 = argmin_e I_e / n_e
//            over experts e != e0 with n_e >= 2 held by some rank not holding e0 (ties: lower id),
//            and the target is the least-loaded such rank holding e1, whose e1 replica is shrunk;
//   t1 = the step time after Shrink(e1) + Expand(e0 -> target), copying from the holder of e0
//        with the fastest link to the target (ties: lower rank);
//   apply when t1 < t0. No target (e0 on every rank, or nothing to shrink) counts as t1 >= t0.
// Migrate (FlexMoE moves replicas to fewer ranks to cut their gradient sync): with replicas of
// one expert on one rank forbidden, moving a replica onto another holder of its expert is dropping
// it, its tokens routed to the remaining holders. When no Expand was applied in a round (balanced
// already, or it did not pay) and options.migrate is set, the policy tries dropping each replica
// of every expert with n_e >= 2 and applies the one with the lowest step time (ties: lower expert,
// then lower rank) when that is below t0. It stops when neither move pays or after max_steps
// moves; so it can stop above the threshold, and migrate below it. Every applied move lowers the
// predicted step time strictly.
Plan make_plan(const VExpertMap& map, const TokenMatrix& tokens, const CostModel& cost,
               const PolicyOptions& options = {});

}  // namespace moe::balance
