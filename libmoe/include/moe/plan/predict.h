// moe-plan predict as a library call: a model (checkpoint or config JSON), a routing trace, a
// cluster spec and a layout in; memory per device by tier and the step time's terms out.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "moe/io/trace.h"
#include "moe/plan/memory_model.h"
#include "moe/plan/step_time.h"

namespace moe::plan {

struct PredictRequest {
  std::string model;    // a checkpoint (.h5) or the model config as JSON (.json)
  std::string trace;    // moe-profile record / moe-train --trace
  std::string cluster;  // cluster spec (TOML)
  std::string layout;   // "ep=8,zero=1,..."
  int64_t batch = 16;   // sequences per rank and step (moe-train --batch)
  int64_t seq = 0;      // tokens per sequence; 0: the model's context
};

struct Prediction {
  PredictRequest request;
  ModelConfig config;
  ClusterSpec cluster;
  Layout layout;
  int64_t tokens_per_rank = 0;
  double active_fraction = 1;
  double ssd_hit_rate = 0;  // offload=ssd: the host cache's, replayed from the trace
  MemoryPlan memory;
  StepTime time;
};

// Reads the model config (a checkpoint's, or a JSON file's), the trace's expert loads (checked
// against the model: MoE layers and experts per layer), the cluster spec and the layout (checked
// against both), then models. moe::Error naming the file and the cause; UsageError for a layout
// that does not fit the cluster or the model.
ModelConfig read_model(const std::string& path);
TraceLoads read_trace_loads(const io::TraceReader& trace, const ModelConfig& config);
Prediction predict(const PredictRequest& request);

// The report: TSV lines ("section\tname\tvalue\tunit"), and the same as JSON.
std::vector<std::string> prediction_tsv(const Prediction& p);
nlohmann::json prediction_json(const Prediction& p);

}  // namespace moe::plan
