// Byte sizes on the command line (see moe/offload/budget.h).
#include "moe/offload/budget.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "moe/error.h"

namespace moe::offload {

int64_t parse_bytes(const std::string& flag, const std::string& text, int64_t total) {
  auto bad = [&](const std::string& why) {
    return UsageError(str(flag, " '", text, "': ", why,
                          " (expected bytes such as 123456, 512MiB, 256M, 1.5GB, or a share "
                          "such as 25%)"));
  };
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  const std::string t = text.substr(b, e - b);
  if (t.empty()) throw bad("empty");
  if (t[0] == '-') throw bad("negative");
  if (!std::isdigit(static_cast<unsigned char>(t[0])) && t[0] != '.') throw bad("not a number");
  // The number: digits with at most one '.', no exponent (so "1e3" is not taken for 1000 bytes).
  size_t i = 0;
  bool dot = false;
  while (i < t.size() &&
         (std::isdigit(static_cast<unsigned char>(t[i])) || (t[i] == '.' && !dot))) {
    if (t[i] == '.') dot = true;
    ++i;
  }
  const std::string number = t.substr(0, i);
  if (number == ".") throw bad("not a number");
  const double value = std::strtod(number.c_str(), nullptr);
  std::string unit;
  for (size_t j = i; j < t.size(); ++j)
    if (!std::isspace(static_cast<unsigned char>(t[j])))
      unit += static_cast<char>(std::tolower(static_cast<unsigned char>(t[j])));
  double bytes = 0;
  if (unit == "%") {
    if (total <= 0) throw bad("a share (%) needs a total to be a share of; give bytes");
    bytes = value / 100.0 * static_cast<double>(total);
  } else {
    static const std::map<std::string, double> units = {{"", 1},
                                                        {"b", 1},
                                                        {"kb", 1e3},
                                                        {"mb", 1e6},
                                                        {"gb", 1e9},
                                                        {"tb", 1e12},
                                                        {"k", 1024.0},
                                                        {"m", 1048576.0},
                                                        {"g", 1073741824.0},
                                                        {"t", 1099511627776.0},
                                                        {"kib", 1024.0},
                                                        {"mib", 1048576.0},
                                                        {"gib", 1073741824.0},
                                                        {"tib", 1099511627776.0}};
    auto it = units.find(unit);
    if (it == units.end()) throw bad(str("unknown unit '", t.substr(i), "'"));
    bytes = value * it->second;
  }
  if (!std::isfinite(bytes) || bytes >= 9.2e18) throw bad("too large");
  return static_cast<int64_t>(std::floor(bytes));
}

int64_t free_bytes(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path p = dir.empty() ? fs::path(".") : fs::path(dir);
  std::error_code ec;
  while (!p.empty() && !fs::exists(p, ec)) p = p.parent_path();
  struct statvfs s {};
  if (::statvfs(p.empty() ? "." : p.c_str(), &s) != 0) return -1;
  return static_cast<int64_t>(std::min<unsigned long long>(
      static_cast<unsigned long long>(s.f_bavail) * s.f_frsize, INT64_MAX));
}

}  // namespace moe::offload
