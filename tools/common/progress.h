// Progress on stderr for every moe tool: a status line rewritten in place on a terminal, lines for
// the record otherwise (logs), rate and ETA in both. moe-train's and moe-distill's step lines
// (step_line) and the per-file work of moe-infer score and moe-profile record (Meter) read alike:
// "<what> | 12.3k tok/s | ETA 1:02", numbers through format_rate and format_duration.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moe/timer.h"
#include "moe/train/run_loop.h"

namespace moe::tools {

// Status line on stderr: rewritten in place on a terminal, one line per call otherwise.
class Progress {
 public:
  explicit Progress(bool quiet);
  void live(const std::string& line);  // on a terminal only
  void line(const std::string& line);  // always (unless quiet)
  void finish();
  bool is_terminal() const { return tty_; }
  bool quiet() const { return quiet_; }

 private:
  bool quiet_, tty_;
  size_t last_width_ = 0;
};

std::string format_duration(double seconds);      // "1:02:03" / "2:03"
std::string format_rate(double per_second);       // "12.3k"
std::string fixed(double value, int digits = 4);  // "%.*f"
std::string format_lr(double lr);                 // "3.00e-04"

// "<tokens_per_s> tok/s | ETA <duration>", the tail of every progress line.
std::string rate_and_eta(double tokens_per_s, double eta_seconds);

// A training step's progress text, as moe-train and moe-distill print it:
// "step 12/300 | loss 2.3456 | <name value>... | lr 3.00e-04 | 1.2k tok/s | ETA 1:02",
// then " | val 2.4000" when the step evaluated.
std::string step_line(const train::StepReport& report,
                      const std::vector<std::pair<std::string, std::string>>& fields);

// Progress of work of known size without a training loop (windows scored, sequences recorded,
// baseline steps): the rate is tokens over the time since the meter started, the ETA the mean
// time per unit so far times the units left. The cadence is the trainer's: a line for the record
// after the first update, at the last (done == total) and every `line_seconds` (0: never by time)
// or when asked; a live status on a terminal in between.
class Meter {
 public:
  Meter(Progress& progress, double line_seconds = 10);
  // Reports `text` + " | <rate> tok/s | ETA <time>" after `done` of `total` units and `tokens`
  // tokens since the meter started.
  void update(const std::string& text, int64_t done, int64_t total, int64_t tokens,
              bool line = false);

 private:
  Progress& progress_;
  double line_seconds_, last_line_ = 0;
  bool first_ = true;
  Timer timer_;
};

}  // namespace moe::tools
