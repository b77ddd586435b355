// Progress lines on stderr (see progress.h).
#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "moe/error.h"

namespace moe::tools {

Progress::Progress(bool quiet) : quiet_(quiet), tty_(::isatty(STDERR_FILENO) == 1) {}

void Progress::live(const std::string& text) {
  if (quiet_ || !tty_) return;
  std::string padded = text;
  if (padded.size() < last_width_) padded.append(last_width_ - padded.size(), ' ');
  std::fprintf(stderr, "\r%s", padded.c_str());
  std::fflush(stderr);
  last_width_ = text.size();
}

void Progress::line(const std::string& text) {
  if (quiet_) return;
  if (tty_ && last_width_) {
    std::fprintf(stderr, "\r%s\r", std::string(last_width_, ' ').c_str());
    last_width_ = 0;
  }
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

void Progress::finish() {
  if (!quiet_ && tty_ && last_width_) {
    std::fprintf(stderr, "\n");
    last_width_ = 0;
  }
}

std::string format_duration(double seconds) {
  long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

std::string format_rate(double v) {
  char buf[32];
  if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

std::string fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

std::string format_lr(double lr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", lr);
  return buf;
}

std::string rate_and_eta(double tokens_per_s, double eta_seconds) {
  return format_rate(tokens_per_s) + " tok/s | ETA " + format_duration(eta_seconds);
}

std::string step_line(const train::StepReport& r,
                      const std::vector<std::pair<std::string, std::string>>& fields) {
  const train::StepStats& s = r.stats;
  std::string text = str("step ", s.step, "/", r.steps, " | loss ", fixed(s.forward.loss));
  for (const auto& [name, value] : fields) text += " | " + name + " " + value;
  text += " | lr " + format_lr(s.lr) + " | " + rate_and_eta(r.ema_tokens_per_s, r.eta_seconds);
  if (r.evaluated) text += " | val " + fixed(r.val_loss);
  return text;
}

Meter::Meter(Progress& progress, double line_seconds)
    : progress_(progress), line_seconds_(line_seconds) {}

void Meter::update(const std::string& text, int64_t done, int64_t total, int64_t tokens,
                   bool line) {
  const double elapsed = timer_.seconds();
  const double rate = static_cast<double>(tokens) / std::max(elapsed, 1e-9);
  const double eta = done > 0 ? elapsed / static_cast<double>(done) *
                                    static_cast<double>(std::max<int64_t>(0, total - done))
                              : 0;
  const std::string full = text + " | " + rate_and_eta(rate, eta);
  if (line || first_ || done >= total ||
      (line_seconds_ > 0 && elapsed - last_line_ >= line_seconds_)) {
    progress_.line(full);
    last_line_ = elapsed;
    first_ = false;
  } else {
    progress_.live(full);
  }
}

}  // namespace moe::tools
