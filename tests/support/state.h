// Bitwise comparison of two runs' tensors (checkpoints, Trainer::snapshot()), for the tests that
// require training paths to agree to the bit.
#pragma once
#include <string>
#include <vector>

#include "moe/error.h"
#include "moe/io/checkpoint.h"
#include "support/bits.h"

namespace moe::test {

// The first difference between two tensor lists, by position: count, name, expert flag, shard,
// shape, dtype or bytes of the whole tensor (a streamed one is gathered); "" when none.
inline std::string first_difference(const std::vector<io::NamedTensor>& x,
                                    const std::vector<io::NamedTensor>& y) {
  if (x.size() != y.size()) return str(x.size(), " tensors against ", y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i].name != y[i].name) return str(x[i].name, " against ", y[i].name);
    if (x[i].expert != y[i].expert || x[i].shard.global != y[i].shard.global ||
        !bitwise_equal(x[i].whole(), y[i].whole()))
      return x[i].name;
  }
  return "";
}

// Parameters, then optimizer state.
inline std::string first_difference(const io::Checkpoint& a, const io::Checkpoint& b) {
  const std::string params = first_difference(a.params, b.params);
  return params.empty() ? first_difference(a.optim, b.optim) : params;
}

}  // namespace moe::test
