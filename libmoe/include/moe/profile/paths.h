// Lina's path-based popularity estimator over routing traces (moe/io/trace.h): the path table,
// its file, and how well it predicts (moe-profile paths / accuracy; infer::LinaPlacement uses
// the table).
//
// Shape letters: L MoE layers, k experts per token, E experts of a layer, l path length.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "moe/io/trace.h"

namespace moe::profile {

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

}  // namespace moe::profile
