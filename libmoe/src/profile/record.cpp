// Trace batches from captured routing (see moe/profile/record.h).
// Shape letters: L MoE layers, k experts per token, E experts of a layer, n tokens.
#include "moe/profile/record.h"

#include <algorithm>

#include "moe/error.h"

namespace moe::profile {

io::TraceInfo trace_info(const ModelConfig& config, io::Provenance provenance,
                         const std::string& source) {
  io::TraceInfo info;
  info.model_config = moe::to_json(config);
  info.provenance = std::move(provenance);
  info.top_k = config.residual_moe ? 1 : config.top_k;
  for (int64_t b = 0; b < config.layers; ++b) {
    if (!config.is_moe_layer(b)) continue;
    info.moe_blocks.push_back(b);
    info.experts.push_back(config.experts_per_layer.at(static_cast<size_t>(b)));
  }
  info.source = source;
  return info;
}

io::TraceBatch trace_batch(const io::TraceInfo& info, const ForwardStats& stats, const Tensor& ids,
                           int64_t step) {
  const auto L = static_cast<int64_t>(info.moe_blocks.size());
  const int64_t k = info.top_k, n = ids.numel();
  int64_t Emax = 0;
  for (int64_t e : info.experts) Emax = std::max(Emax, e);
  MOE_CHECK(static_cast<int64_t>(stats.moe.size()) == L, "trace: the forward pass has ",
            stats.moe.size(), " MoE layers, the trace ", L);
  io::TraceBatch b;
  b.step = step;
  const int32_t* id = ids.data<int32_t>();
  b.token_ids.assign(id, id + n);
  b.experts.resize(static_cast<size_t>(n * L * k));
  b.gates.resize(static_cast<size_t>(n * L * k));
  b.loads.assign(static_cast<size_t>(L * Emax), 0);
  for (int64_t l = 0; l < L; ++l) {
    const nn::MoEStats& m = stats.moe[static_cast<size_t>(l)];
    MOE_CHECK(static_cast<int64_t>(m.choices.size()) == n * k, "trace: layer ", l, " captured ",
              m.choices.size(), " choices for ", n, " tokens x ", k,
              " (run the forward pass with routing capture)");
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < k; ++j) {
        b.experts[static_cast<size_t>((t * L + l) * k + j)] =
            m.choices[static_cast<size_t>(t * k + j)];
        b.gates[static_cast<size_t>((t * L + l) * k + j)] = m.gates[static_cast<size_t>(t * k + j)];
      }
    for (size_t e = 0; e < m.load.size(); ++e)
      b.loads[static_cast<size_t>(l * Emax) + e] = m.load[e];
    b.dropped.push_back(m.dropped);
  }
  return b;
}

}  // namespace moe::profile
