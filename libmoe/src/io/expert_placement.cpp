// Expert placement of checkpoint conversions (see moe/io/convert.h): the per-layer plan from a
// routing trace. The placements themselves are balance/'s (moe/balance/placement.h). Shape
// letters: E experts of a layer, L MoE layers, N ranks.

#include <algorithm>
#include <numeric>

#include "io/convert_internal.h"
#include "moe/io/convert.h"

namespace moe::io {

std::vector<LayerPlacement> plan_placement(const ModelConfig& model, const TraceReader& trace,
                                           int ranks) {
  const TraceInfo& info = trace.info();
  std::vector<int64_t> blocks, experts;
  for (size_t b = 0; b < model.experts_per_layer.size(); ++b)
    if (model.experts_per_layer[b] > 0) {
      blocks.push_back(static_cast<int64_t>(b));
      experts.push_back(model.experts_per_layer[b]);
    }
  const int64_t top_k = model.residual_moe ? 1 : model.top_k;
  auto list = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(v[i]);
    }
    return "[" + s + "]";
  };
  if (info.moe_blocks != blocks || info.experts != experts || info.top_k != top_k)
    throw Error(str("trace '", trace.name(), "' does not come from this model: its MoE blocks ",
                    list(info.moe_blocks), " with experts ", list(info.experts), ", top-",
                    info.top_k, "; the checkpoint's MoE blocks ", list(blocks), " with experts ",
                    list(experts), ", top-", top_k));
  // Rows routed to each expert over the whole trace: the loads the placements balance (the same
  // counts moe-profile summary reports).
  const std::vector<std::vector<int64_t>> summary = trace.summed_loads();
  std::vector<LayerPlacement> out;
  for (size_t l = 0; l < summary.size(); ++l) {
    LayerPlacement p;
    p.layer = static_cast<int64_t>(l);
    p.block = blocks[l];
    p.experts = experts[l];
    p.loads = summary[l];
    p.loads.resize(static_cast<size_t>(p.experts), 0);
    p.lpt = balance::lpt_placement(p.loads, ranks);
    p.contiguous = balance::contiguous_placement(p.experts, ranks);
    p.round_robin = balance::round_robin_placement(p.experts, ranks);
    p.lpt_max_over_mean = balance::max_over_mean(balance::rank_loads(p.loads, p.lpt, ranks));
    p.contiguous_max_over_mean =
        balance::max_over_mean(balance::rank_loads(p.loads, p.contiguous, ranks));
    p.round_robin_max_over_mean =
        balance::max_over_mean(balance::rank_loads(p.loads, p.round_robin, ranks));
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace moe::io
