// moe-plan predict as a library call: a model (checkpoint or config JSON), a routing trace, a
// cluster spec and a layout in; memory per device by tier and the step time's terms out.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "moe/io/trace.h"
#include "moe/offload/cache_sim.h"
#include "moe/plan/memory_model.h"
#include "moe/plan/step_time.h"

namespace moe::plan {

struct PredictRequest {
  std::string model;    // a checkpoint (.h5), a model config (.json), a Hugging Face model
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

// What a prediction is made from, read once (search predicts every layout from one).
struct SearchInputs {
  ModelConfig config;   // resolved
  ClusterSpec cluster;  // the ranks predicted for
  TraceLoads trace;
  offload::AccessSequence accesses;  // the trace's training accesses (offload=ssd's hit rate)
  int64_t tokens_per_rank = 0;
  std::string model_name;  // for reports: the model file
};

// Reads the model config: a checkpoint's; a JSON file's (ours, moe-convert inspect --json's, or a
// Hugging Face config.json); a Hugging Face directory's config.json, as import-hf would read it
// (io::hf_model_config: nothing converted, no tensor read). The trace's expert loads are checked
// against the model (MoE layers and experts per layer). moe::Error naming the file and the cause.
ModelConfig read_model(const std::string& path);
TraceLoads read_trace_loads(const io::TraceReader& trace, const ModelConfig& config);
// Reads the model, the cluster spec and the trace (`batch` sequences of `seq` tokens per rank, 0:
// the model's context), and the trace's training accesses as `accesses` says.
enum class TraceAccesses { no, read, if_cluster_has_ssd };
SearchInputs read_plan_inputs(const std::string& model, const std::string& trace,
                              const std::string& cluster, int64_t batch, int64_t seq,
                              TraceAccesses accesses);
// Models one layout (checked against the model and the cluster: UsageError for one that does not
// fit them): plan_memory, predict_step, and for offload=ssd the host cache's hit rate replayed from
// the accesses.
Prediction predict_layout(const SearchInputs& inputs, const Layout& layout);
// read_plan_inputs then predict_layout of the request's layout.
Prediction predict(const PredictRequest& request);

// The report: TSV lines ("section\tname\tvalue\tunit"), and the same as JSON.
std::vector<std::string> prediction_tsv(const Prediction& p);
nlohmann::json prediction_json(const Prediction& p);

}  // namespace moe::plan
