// The cadence of a training run, one loop for every trainer built on train::Trainer (moe-train's
// runs and moe-distill's distillation): a stop request checked before every step, validation
// every eval_every steps and at the end, a checkpoint every checkpoint_every steps and at the end,
// a progress line every log_every steps (and after the first step and every evaluation; a live
// status in between), a metrics line on the same steps. What a step is, how a line reads and where
// it goes are the caller's hooks; the loop decides when.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "moe/train/trainer.h"

namespace moe::train {

struct RunCadence {
  std::string out;               // the run's directory (Trainer::save)
  int64_t eval_every = 50;       // 0: only at the end
  int64_t checkpoint_every = 0;  // 0: only at the end
  int64_t log_every = 10;
};

// What one step of the loop did, for the hooks that report it.
struct StepReport {
  const StepStats& stats;
  int64_t first_step = 0;   // steps done when the loop started
  int64_t steps = 0;        // the run ends after this step (TrainConfig::steps)
  bool evaluated = false;   // validation ran after this step
  double val_loss = 0;      // NaN unless evaluated
  bool line = false;        // a progress line for the record (else a live status, terminals only)
  double tokens_per_s = 0;  // this step's
  double ema_tokens_per_s = 0;  // smoothed over the steps of this loop (0.9 old + 0.1 new)
  double eta_seconds = 0;       // to the last step, at the mean step time of this loop
};

struct RunResult {
  bool stopped = false;    // hooks.stop said so before the last step (nothing saved for it)
  std::string last_saved;  // the newest checkpoint the loop wrote; empty when none
  double last_val_loss = std::numeric_limits<double>::quiet_NaN();  // the newest; NaN: none ran
};

class RunLoop {
 public:
  struct Hooks {
    // Before every step: end the run now. Saving what was trained is then the caller's (its
    // messages differ); every rank of a distributed run must answer alike.
    std::function<bool()> stop;
    // One optimizer step (empty: trainer.step()).
    std::function<StepStats()> step;
    // The step's progress text: a line when report.line, else a live status.
    std::function<void(const StepReport& report)> log;
    // Empty: no metrics. Else called on metrics steps with the line's common fields filled (step,
    // loss, lr, tokens_per_s, aux_loss, z_loss, expert_load_max_over_mean, dropped_fraction,
    // grad_norm, tokens_seen; val_loss when evaluated); adds its own fields and writes it.
    std::function<void(const StepReport& report, nlohmann::json& line)> metrics;
  };

  // `trainer` must outlive the loop.
  RunLoop(Trainer& trainer, RunCadence cadence, Hooks hooks);

  // Steps until the trainer has done TrainConfig::steps or hooks.stop says so. Logs
  // "checkpoint <path>" for every checkpoint.
  RunResult run();

 private:
  Trainer& trainer_;
  RunCadence cadence_;
  Hooks hooks_;
};

}  // namespace moe::train
