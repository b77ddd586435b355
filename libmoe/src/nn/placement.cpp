// Expert assignments (see moe/nn/placement.h).
#include "moe/nn/placement.h"

#include <algorithm>

#include "moe/error.h"

namespace moe::nn {

ExpertAssignment ExpertAssignment::contiguous(int64_t experts, int ranks) {
  MOE_CHECK(ranks > 0 && experts % ranks == 0, experts, " experts do not divide over ", ranks,
            " ranks");
  ExpertAssignment a;
  a.replicas.resize(static_cast<size_t>(experts));
  const int64_t per = experts / ranks;
  for (int64_t e = 0; e < experts; ++e)
    a.replicas[static_cast<size_t>(e)] = {static_cast<int32_t>(e / per)};
  return a;
}

std::vector<int64_t> ExpertAssignment::rank_rows(
    const std::vector<std::vector<int64_t>>& counts) const {
  int32_t ranks = 0;
  for (const auto& reps : replicas)
    for (int32_t p : reps) ranks = std::max(ranks, p + 1);
  ranks = std::max(ranks, static_cast<int32_t>(counts.size()));
  std::vector<int64_t> rows(static_cast<size_t>(ranks), 0);
  for (size_t s = 0; s < counts.size(); ++s) {
    MOE_CHECK(counts[s].size() == replicas.size(), "rank_rows: ", counts[s].size(), " counts for ",
              replicas.size(), " experts");
    for (size_t e = 0; e < replicas.size(); ++e) {
      const auto n = static_cast<int64_t>(replicas[e].size());
      for (int64_t j = 0; j < n; ++j) {
        const int32_t p = replicas[e][static_cast<size_t>((j + static_cast<int64_t>(s)) % n)];
        rows[static_cast<size_t>(p)] +=
            split_begin(counts[s][e], n, j + 1) - split_begin(counts[s][e], n, j);
      }
    }
  }
  return rows;
}

}  // namespace moe::nn
