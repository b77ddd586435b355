// Per-layer popularity summaries of a trace (see moe/profile/summary.h).
// Shape letters: L MoE layers, k experts per token, E experts of a layer, B batches.
#include "moe/profile/summary.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "moe/error.h"
#include "profile/trace_blocks.h"

namespace moe::profile {

using detail::ranked;

std::vector<LayerSummary> summarize(const io::TraceReader& trace) {
  const io::TraceInfo& info = trace.info();
  const int64_t L = trace.layers(), B = trace.batches();
  const std::vector<std::vector<int64_t>> counts = trace.summed_loads();
  const std::vector<int64_t> dropped = trace.dropped();
  int64_t tokens = 0;
  for (int64_t t : trace.batch_tokens()) tokens += t;
  std::vector<LayerSummary> out(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    LayerSummary& s = out[static_cast<size_t>(l)];
    s.layer = l;
    s.block = info.moe_blocks.at(static_cast<size_t>(l));
    s.experts = info.experts.at(static_cast<size_t>(l));
    s.tokens = tokens;
    s.assignments = tokens * info.top_k;
    s.counts = counts[static_cast<size_t>(l)];
    for (int64_t b = 0; b < B; ++b) s.dropped += dropped[static_cast<size_t>(b * L + l)];
    const double E = static_cast<double>(s.experts);
    double sum = 0, mx = 0, mn = std::numeric_limits<double>::infinity();
    for (int64_t c : s.counts) {
      sum += double(c);
      mx = std::max(mx, double(c));
      mn = std::min(mn, double(c));
    }
    const double mean = sum / E;
    double var = 0, entropy = 0;
    for (int64_t c : s.counts) {
      var += (double(c) - mean) * (double(c) - mean) / E;
      if (c > 0) entropy -= double(c) / sum * std::log2(double(c) / sum);
    }
    s.max_over_mean = mean > 0 ? mx / mean : 0;
    s.max_over_min = sum == 0 ? 0 : mn > 0 ? mx / mn : std::numeric_limits<double>::infinity();
    s.cv = mean > 0 ? std::sqrt(var) / mean : 0;
    s.entropy_bits = sum > 0 ? entropy : 0;
    s.entropy_norm = s.experts > 1 && sum > 0 ? entropy / std::log2(E) : 0;
    s.dropped_fraction = s.assignments ? double(s.dropped) / double(s.assignments) : 0;
    s.top = ranked(s.counts);
  }
  return out;
}

nlohmann::json to_json(const LayerSummary& s) {
  auto finite = [](double v) {
    return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  };
  return {{"layer", s.layer},
          {"block", s.block},
          {"experts", s.experts},
          {"tokens", s.tokens},
          {"assignments", s.assignments},
          {"counts", s.counts},
          {"max_over_mean", s.max_over_mean},
          {"max_over_min", finite(s.max_over_min)},
          {"cv", s.cv},
          {"entropy_bits", s.entropy_bits},
          {"entropy_norm", s.entropy_norm},
          {"top_experts", s.top},
          {"dropped", s.dropped},
          {"dropped_fraction", s.dropped_fraction}};
}

}  // namespace moe::profile
