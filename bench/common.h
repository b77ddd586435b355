// What the benchmark programs share: number arguments and the final check of stdout.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>

namespace moe::bench {

// Parses `text` as the value of `flag`; prints "<tool>: error: ..." and returns false when it is
// not a number, is negative, or is zero where zero is not allowed.
inline bool parse_number(const char* tool, const std::string& flag, const char* text,
                         bool allow_zero, double& value) {
  char* end = nullptr;
  value = std::strtod(text, &end);
  if (!end || *end || value < 0 || (!allow_zero && value == 0)) {
    std::fprintf(stderr, "%s: error: bad value '%s' for %s\n", tool, text, flag.c_str());
    return false;
  }
  return true;
}

// Flushes stdout; the exit status is 1 when the table did not all reach it (full disk, closed
// pipe).
inline int finish_stdout(const char* tool) {
  std::fflush(stdout);
  if (std::ferror(stdout)) {
    std::fprintf(stderr, "%s: error: writing stdout failed\n", tool);
    return 1;
  }
  return 0;
}

}  // namespace moe::bench
