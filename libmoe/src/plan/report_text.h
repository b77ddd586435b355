// Numbers as people read them in moe-plan's reports and pictures: bytes in SI units ("1.25 GB",
// as the specs and the README write them) and seconds in the largest unit below them ("34.2 ms");
// thresholds at 999.5 so that rounding never prints "1e+03". Three significant digits: the model is
// a plan, not a measurement.
#pragma once
#include <cmath>
#include <cstdio>
#include <string>

namespace moe::plan {

// `v` in steps of 1000 through `units` (at most `n`), three significant digits, the unit after
// `gap`: "1.25 GB", "957k".
inline std::string human_scaled(double v, const char* const* units, int n, const char* gap) {
  int u = 0;
  while (u < n - 1 && std::fabs(v) >= 999.5) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g%s%s", v, gap, units[u]);
  return buf;
}

inline std::string human_bytes(double bytes) {
  static const char* const units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  return human_scaled(bytes, units, 6, " ");
}

inline std::string human_seconds(double s) {
  char buf[32];
  if (s == 0)
    std::snprintf(buf, sizeof buf, "0 s");
  else if (std::fabs(s) < 0.9995e-6)
    std::snprintf(buf, sizeof buf, "%.3g ns", s * 1e9);
  else if (std::fabs(s) < 0.9995e-3)
    std::snprintf(buf, sizeof buf, "%.3g us", s * 1e6);
  else if (std::fabs(s) < 0.9995)
    std::snprintf(buf, sizeof buf, "%.3g ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}

// Counts (tokens/s) with k, M, G: "957k", "3.04M".
inline std::string human_count(double v) {
  static const char* const units[] = {"", "k", "M", "G", "T"};
  return human_scaled(v, units, 5, "");
}

// Whole percents; below 1%, one significant digit ("0.05%"), so a small gap does not read "0%".
inline std::string percent_text(double fraction) {
  char buf[32];
  const double p = 100 * fraction;
  std::snprintf(buf, sizeof buf, p > 0 && p < 0.995 ? "%.1g%%" : "%.0f%%", p);
  return buf;
}

// The TSV reports' numbers: six significant digits; bytes whole, every digit.
inline std::string tsv_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

inline std::string tsv_whole(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

}  // namespace moe::plan
