// What the profile sources share: streaming a trace's tokens in blocks, ranking experts.
// Shape letters: L MoE layers, k experts per token, n tokens of a block.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "moe/io/trace.h"

namespace moe::profile::detail {

inline constexpr int64_t kBlockTokens = 65536;  // tokens read per block when streaming a trace

// Experts by count descending, ties by lower id.
inline std::vector<int64_t> ranked(const std::vector<int64_t>& counts) {
  std::vector<int64_t> order(counts.size());
  for (size_t e = 0; e < order.size(); ++e) order[e] = static_cast<int64_t>(e);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return counts[static_cast<size_t>(a)] > counts[static_cast<size_t>(b)];
  });
  return order;
}

// Calls fn(n, experts) for consecutive blocks of the trace's tokens (experts [n, L, k]).
template <typename Fn>
void for_each_block(const io::TraceReader& trace, Fn fn) {
  std::vector<int32_t> experts;
  for (int64_t begin = 0; begin < trace.tokens(); begin += kBlockTokens) {
    const int64_t end = std::min(trace.tokens(), begin + kBlockTokens);
    trace.read_tokens(begin, end, experts);
    fn(end - begin, experts);
  }
}

}  // namespace moe::profile::detail
