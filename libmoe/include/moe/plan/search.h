// moe-plan search as a library call: every legal layout of a model on a cluster, each predicted
// with predict's model (plan_memory, predict_step, the SSD tier's replayed host cache), those
// that do not fit memory dropped and counted by the tier they are short of, the rest ranked by
// predicted tokens/s, and the top few explained against the layout ranked after them.
//
// The layouts (moe/plan/layout.h's keys), over R ranks:
//   ep         every divisor of R that divides every MoE layer's experts (dp = R / ep)
//   zero       0..3 where R > 1 (one rank has nothing to shard)
//   offload    none; host where the spec has host memory; ssd where it has an SSD
//   placement  static; lpt and flexmoe where ep > 1
//   a2a        flat; hierarchical where the EP group spans nodes of more than one device (ep >
//              devices per node > 1): inside one node, or with one device a node, both send the
//              same messages, and predict prices them the same
//   scheduler  off; priority where R > 1 (with one rank there is no all-reduce to hide)
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "moe/offload/cache_sim.h"
#include "moe/plan/predict.h"

namespace moe::plan {

struct SearchRequest {
  std::string model, trace, cluster;  // as PredictRequest's
  int64_t batch = 16;                 // sequences per rank and step
  int64_t seq = 0;                    // tokens per sequence; 0: the model's context
  int64_t ranks = 0;                  // 0: every device of the cluster (see ranks_of)
};

// The part of `cluster` a search over `ranks` ranks uses: part of one node (ranks <= devices per
// node) or whole nodes (a multiple of it); 0 means all of it. UsageError naming --ranks when
// neither, or when the cluster has fewer.
ClusterSpec ranks_of(const ClusterSpec& cluster, int64_t ranks);

// Every legal layout, in a fixed order (simplest first: ep ascending, then zero, offload,
// placement, a2a, scheduler as listed above); dp resolved.
std::vector<Layout> enumerate_layouts(const ModelConfig& config, const ClusterSpec& cluster);

struct Ranked {
  Prediction prediction;
  std::string why;  // the top few only: what separates it from the next one; else empty
};

struct SearchResult {
  SearchInputs inputs;
  int64_t considered = 0;
  int64_t short_of[3] = {0, 0, 0};  // dropped layouts by the first tier they do not fit
  std::vector<Ranked> ranked;       // the layouts that fit, fastest first
  int64_t dropped() const { return short_of[0] + short_of[1] + short_of[2]; }
  // "240 layouts of 4 ranks considered, 96 fit; 144 dropped: 120 short of device memory, ..."
  std::string summary() const;
};

// Ranks every layout that fits, fastest first (ties: less device memory, then the enumeration
// order), and explains the first `explain` of them. moe::Error when no layout fits: how many were
// tried, by which tier they fall short, and the layout that came closest and by how much.
SearchResult search(const SearchInputs& inputs, int64_t explain = 3);
// Reads the files (as predict() does) and searches.
SearchInputs read_search_inputs(const SearchRequest& request);

// Why `a` ranks above `b`: the critical-path term that saves the most time, by how much, and the
// layout keys that differ ("all-to-all 31% lower than #2 (a2a=flat): a2a=hierarchical").
// `b_rank` is b's place in the ranking (1-based).
std::string explain(const Prediction& a, const Prediction& b, int64_t b_rank);

// The report: TSV lines (comment lines, a header, one row per ranked layout, the first `top`;
// 0: all), and the same as JSON.
std::vector<std::string> search_tsv(const SearchResult& result, int64_t top);
nlohmann::json search_json(const SearchResult& result, int64_t top);

}  // namespace moe::plan
