#include "moe/log.h"

#include <cstdio>
#include <mutex>

namespace moe {
namespace {
LogLevel g_level = LogLevel::info;
std::mutex g_mutex;
const char* level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::error:
      return "error";
    case LogLevel::warn:
      return "warning";
    case LogLevel::info:
      return "info";
    case LogLevel::debug:
      return "debug";
  }
  return "?";
}
}  // namespace

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }

void log_write(LogLevel level, const std::string& message) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "[%s] %s\n", level_tag(level), message.c_str());
  std::fflush(stderr);
}

}  // namespace moe
