// The plan layer's check: a moe::Error whose message is the user's words only (a file, a key, a
// value), without the source location MOE_CHECK appends for internal failures.
#pragma once
#include "moe/error.h"

#define PLAN_CHECK(cond, ...)                                 \
  do {                                                        \
    if (!(cond)) throw ::moe::Error(::moe::str(__VA_ARGS__)); \
  } while (0)
