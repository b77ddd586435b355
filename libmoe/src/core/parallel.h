// When an OpenMP loop is worth forking: below this many element-operations the fork/join costs
// more than the loop (and on a loaded machine a descheduled worker stalls the barrier).
#pragma once
#include <cstdint>

namespace moe::cpu {
inline constexpr int64_t kParallelWork = int64_t(1) << 15;
}  // namespace moe::cpu
