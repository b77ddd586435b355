#include "moe/train/run_loop.h"

#include <algorithm>
#include <cmath>

#include "moe/log.h"

namespace moe::train {

RunLoop::RunLoop(Trainer& trainer, RunCadence cadence, Hooks hooks)
    : trainer_(trainer), cadence_(std::move(cadence)), hooks_(std::move(hooks)) {}

RunResult RunLoop::run() {
  RunResult result;
  const int64_t steps = trainer_.config().steps;
  const int64_t first_step = trainer_.steps_done();
  double elapsed = 0, ema_rate = 0;
  while (trainer_.steps_done() < steps) {
    if (hooks_.stop && hooks_.stop()) {
      result.stopped = true;
      return result;
    }
    const StepStats s = hooks_.step ? hooks_.step() : trainer_.step();
    elapsed += s.seconds;
    const double rate = static_cast<double>(s.tokens) / std::max(s.seconds, 1e-9);
    ema_rate = ema_rate == 0 ? rate : 0.9 * ema_rate + 0.1 * rate;
    const bool last = s.step == steps;
    const bool do_eval = last || (cadence_.eval_every > 0 && s.step % cadence_.eval_every == 0);
    const double val = do_eval ? trainer_.evaluate() : NAN;
    if (do_eval) result.last_val_loss = val;
    StepReport report{s};
    report.first_step = first_step;
    report.steps = steps;
    report.evaluated = do_eval;
    report.val_loss = val;
    report.line = do_eval || s.step % cadence_.log_every == 0 || s.step == first_step + 1;
    report.tokens_per_s = rate;
    report.ema_tokens_per_s = ema_rate;
    report.eta_seconds =
        elapsed / static_cast<double>(s.step - first_step) * static_cast<double>(steps - s.step);
    if (hooks_.log) hooks_.log(report);
    if (hooks_.metrics && (do_eval || s.step % cadence_.log_every == 0)) {
      nlohmann::json j{{"step", s.step},
                       {"loss", s.forward.loss},
                       {"lr", s.lr},
                       {"tokens_per_s", rate},
                       {"aux_loss", s.forward.aux_loss},
                       {"z_loss", s.forward.z_loss},
                       {"expert_load_max_over_mean", s.load_max_over_mean},
                       {"dropped_fraction", s.dropped_fraction},
                       {"grad_norm", s.grad_norm},
                       {"activation_peak_bytes", s.activation_peak_bytes},
                       {"tokens_seen", trainer_.tokens_seen()}};
      if (do_eval) j["val_loss"] = val;
      hooks_.metrics(report, j);
    }
    if (last || (cadence_.checkpoint_every > 0 && s.step % cadence_.checkpoint_every == 0)) {
      result.last_saved = trainer_.save(cadence_.out);
      MOE_LOG_INFO("checkpoint ", result.last_saved);
    }
  }
  return result;
}

}  // namespace moe::train
