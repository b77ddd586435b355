// Levelled logging to stderr. stdout is data; stderr is people.
#pragma once
#include "moe/error.h"

namespace moe {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_write(LogLevel level, const std::string& message);

}  // namespace moe

#define MOE_LOG_AT(level, ...)                                           \
  do {                                                                   \
    if (static_cast<int>(level) <= static_cast<int>(::moe::log_level())) \
      ::moe::log_write(level, ::moe::str(__VA_ARGS__));                  \
  } while (0)
#define MOE_LOG_ERROR(...) MOE_LOG_AT(::moe::LogLevel::error, __VA_ARGS__)
#define MOE_LOG_WARN(...) MOE_LOG_AT(::moe::LogLevel::warn, __VA_ARGS__)
#define MOE_LOG_INFO(...) MOE_LOG_AT(::moe::LogLevel::info, __VA_ARGS__)
#define MOE_LOG_DEBUG(...) MOE_LOG_AT(::moe::LogLevel::debug, __VA_ARGS__)
