// The optional features of a training step as hooks around its plain phases (Trainer::step,
// trainer_step.cpp): batch -> passes (forward/backward) -> reduce -> clip -> update.
//
//   begin_step  the step's batch drawn and its gradients zeroed, before the first pass
//   begin_pass  before each pass's forward/backward: may set the pass's loss and parameter hooks
//   end_pass    after each pass (ctx.last_pass on the step's last one)
//   end_step    after the update, with ctx.step the steps done now
//
// Trainer::step_hooks lists the run's features (router centring, balance bias, tasks, ZeRO-3
// prefetch, placement, expert store) every step; each point calls them in list order, the order
// in which the step ran them before they were hooks (centring's calibration before the prefetch's
// and the store's counters are read; the tasks' replan before the placement's).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "moe/models/transformer.h"
#include "moe/train/tasks.h"
#include "moe/train/trainer.h"

namespace moe::train {

// A step's data: the global batch (--tasks: this rank's rows of the tasks' batches, one pass) and
// its passes. Pass m is rows [m B/A, (m+1) B/A) of the global batch, on any number of ranks, and
// rank r trains the r-th of its W equal shares: so each pass holds the same tokens whatever W.
struct StepBatch {
  Tensor ids, targets;
  TaskBatch tasks;  // --tasks only
  bool by_task = false;
  int64_t micro = 1, rows = 0;  // passes, and the rows of each on this rank
  int64_t world = 1, rank = 0;
  int64_t first_row(int64_t m) const { return by_task ? int64_t{0} : (m * world + rank) * rows; }
  Tensor pass_ids(int64_t m) const { return ids.rows(first_row(m), first_row(m) + rows); }
  Tensor pass_targets(int64_t m) const { return targets.rows(first_row(m), first_row(m) + rows); }
  // The pass's first token in the global batch (router jitter is keyed by it).
  int64_t first_token(int64_t m) const {
    return by_task ? tasks.first_token : first_row(m) * ids.dim(1);
  }
};

struct StepContext {
  StepStats& stats;
  const StepBatch& batch;
  int64_t step = 0;         // steps done (before this one, but in end_step)
  bool last_pass = false;   // end_pass: the step's last pass
  double pass_seconds = 0;  // end_pass: the pass's forward/backward
};

class StepHook {
 public:
  virtual ~StepHook() = default;
  virtual void begin_step(StepContext&) {}
  virtual void begin_pass(StepContext&, int64_t /*pass*/, TrainPass&) {}
  virtual void end_pass(StepContext&) {}
  virtual void end_step(StepContext&) {}
};

using StepHooks = std::vector<std::unique_ptr<StepHook>>;

}  // namespace moe::train
