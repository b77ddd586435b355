// StepBreakdown's names, sums and text; the thread's recorder (moe/step_breakdown.h).
#include "moe/step_breakdown.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace moe {

const char* step_part_name(StepPart part) {
  static const char* const names[kStepParts] = {"gemm",     "attention", "elementwise", "router",
                                                "dispatch", "loss",      "optimizer",   "memory",
                                                "comm",     "other"};
  const int i = static_cast<int>(part);
  return i >= 0 && i < kStepParts ? names[i] : "?";
}

double StepBreakdown::total() const {
  double sum = 0;
  for (double s : seconds) sum += s;
  return sum;
}

StepBreakdown& StepBreakdown::operator+=(const StepBreakdown& other) {
  for (size_t i = 0; i < seconds.size(); ++i) seconds[i] += other.seconds[i];
  gemm_flops += other.gemm_flops;
  return *this;
}

std::string StepBreakdown::describe(double per) const {
  const double sum = total();
  if (sum <= 0) return "(nothing recorded)";
  std::vector<int> order;
  for (int i = 0; i < kStepParts; ++i)
    if (seconds[static_cast<size_t>(i)] >= 0.005 * sum) order.push_back(i);
  // Largest first: the line is read for where the time goes.
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return seconds[static_cast<size_t>(a)] > seconds[static_cast<size_t>(b)];
  });
  std::string text;
  char buf[128];
  for (int i : order) {
    const double s = seconds[static_cast<size_t>(i)];
    std::snprintf(buf, sizeof buf, "%s%s %.4f s %.0f%%", text.empty() ? "" : " | ",
                  step_part_name(static_cast<StepPart>(i)), s / std::max(per, 1e-300),
                  100 * s / sum);
    text += buf;
    if (static_cast<StepPart>(i) == StepPart::gemm && gemm_flops > 0) {
      std::snprintf(buf, sizeof buf, " %.0f GFLOP/s", gemm_flops / s / 1e9);
      text += buf;
    }
  }
  return text;
}

StepRecording::StepRecording(StepBreakdown& into, void (*wait)(int), int wait_arg)
    : outer_(detail::current_recorder()) {
  recorder_.wait = wait;
  recorder_.wait_arg = wait_arg;
  const auto now = recorder_.settle_now();
  if (outer_) outer_->charge(now);  // a nested recording takes over until it ends
  recorder_.into = &into;
  recorder_.mark = now;
  detail::current_recorder() = &recorder_;
}

StepRecording::~StepRecording() {
  const auto now = recorder_.settle_now();
  recorder_.charge(now);
  detail::current_recorder() = outer_;
  if (outer_) outer_->mark = now;
}

}  // namespace moe
