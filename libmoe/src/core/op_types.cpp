#include "moe/op_types.h"

#include "moe/error.h"

namespace moe::ops {

int64_t CachedRows::tokens() const {
  int64_t n = 0;
  for (int64_t c : count) n += c;
  return n;
}

void CachedRows::check(int64_t slots, int64_t capacity, const char* what) const {
  const size_t r = count.size();
  MOE_CHECK(slot.size() == r && start.size() == r, what, ": ", r, " counts, ", slot.size(),
            " slots and ", start.size(), " starts");
  MOE_CHECK(window >= 0, what, ": a sliding window of ", window, " positions");
  std::vector<bool> used(static_cast<size_t>(slots > 0 ? slots : 0), false);
  for (size_t i = 0; i < r; ++i) {
    MOE_CHECK(count[i] >= 1 && start[i] >= 0 && slot[i] >= 0 && slot[i] < slots, what, ": row ", i,
              " has count ", count[i], ", start ", start[i], ", slot ", slot[i], " (of ", slots,
              ")");
    MOE_CHECK(!used[static_cast<size_t>(slot[i])], what, ": slot ", slot[i], " appears twice");
    used[static_cast<size_t>(slot[i])] = true;
    MOE_CHECK(start[i] + count[i] <= capacity, what, ": row ", i, " reaches position ",
              start[i] + count[i], ", beyond the cache's ", capacity);
  }
}

}  // namespace moe::ops
