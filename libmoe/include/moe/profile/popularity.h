// Expert popularity from routing traces (moe/io/trace.h): per-layer load summaries, Lina's
// path-based popularity estimator and its accuracy, and an SVG picture.
//
// Shape letters: L MoE layers, k experts per token, E experts of a layer, l path length.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "moe/io/trace.h"
#include "moe/models/transformer.h"

namespace moe::profile {

// Recording (moe-profile record, moe-train --trace): the trace header of a model, and one batch
// from a forward pass run with routing capture (EvalOptions::capture_routing or
// RouterStep::capture_routing). ids: the batch's token ids, [B,T] or [N].
io::TraceInfo trace_info(const ModelConfig& config, io::Provenance provenance,
                         const std::string& source);
io::TraceBatch trace_batch(const io::TraceInfo& info, const ForwardStats& stats, const Tensor& ids,
                           int64_t step);

// One MoE layer over a whole trace. Counts are assignments (every one of a token's k choices),
// before capacity.
struct LayerSummary {
  int64_t layer = 0, block = 0, experts = 0;
  int64_t tokens = 0, assignments = 0, dropped = 0;
  std::vector<int64_t> counts;  // [E]
  double max_over_mean = 0;     // max count / mean count
  double max_over_min = 0;      // max / min; infinity when an expert got nothing
  double cv = 0;                // coefficient of variation: std / mean (population std)
  double entropy_bits = 0;      // of the load distribution; log2(E) when perfectly balanced
  double entropy_norm = 0;      // entropy_bits / log2(E) (1 = balanced)
  double dropped_fraction = 0;  // dropped / assignments
  std::vector<int64_t> top;     // experts by count, descending (ties: lower id first)
};
std::vector<LayerSummary> summarize(const io::TraceReader& trace);
nlohmann::json to_json(const LayerSummary& s);

// Lina's estimator (ATC'23 §5): a token's expert at layer i+1 is predicted from the path of
// experts it took over layers i-l+1..i (clipped at layer 0). A token's expert at a layer is its
// first (highest-gate) choice; the distribution at layer i+1 counts all k of its choices.
struct PathTable {
  int64_t path_length = 1, top_k = 1;
  std::vector<int64_t> experts;  // [L]
  // next[i]: for predicting layer i+1 (i = 0..L-2), path (experts at layers max(0,i-l+1)..i) ->
  // counts over layer i+1's experts.
  std::vector<std::map<std::vector<int32_t>, std::vector<int64_t>>> next;
  std::vector<std::vector<int64_t>> marginal;  // [L][E]: counts at each layer, any path
};
// Streams the trace in blocks of tokens. path_length >= 1, else UsageError.
PathTable build_paths(const io::TraceReader& trace, int64_t path_length);
// JSON (format "moe.paths", version 1; docs/FORMATS.md). Writes atomically.
void save_paths(const PathTable& table, const std::string& path);
PathTable load_paths(const std::string& path);  // Error naming the file and the cause

// Per predicted layer (1..L-1): how often the estimated top-2k set of experts holds all k experts
// the token actually chose (Lina's measure), from the token's path; tokens whose path the table
// never saw fall back to the layer's marginal counts. `marginal_*` is the same with the marginal
// counts only (the baseline without paths).
struct LayerAccuracy {
  int64_t layer = 0, tokens = 0, hits = 0, marginal_hits = 0, unseen_paths = 0;
  double accuracy() const { return tokens ? double(hits) / double(tokens) : 0.0; }
  double marginal_accuracy() const { return tokens ? double(marginal_hits) / double(tokens) : 0.0; }
};
// The table and the trace must come from the same model shape (L, k, experts), else Error.
std::vector<LayerAccuracy> accuracy(const PathTable& table, const io::TraceReader& trace);

// An SVG document: a layer x expert heatmap of each expert's share of its layer's assignments,
// and per-batch load imbalance (max/mean) of every layer over the trace.
std::string plot_svg(const io::TraceReader& trace, const std::string& title);

}  // namespace moe::profile
