// moe-plan predict (moe/plan/predict.h): read, check, model, report.
#include "moe/plan/predict.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moe/error.h"
#include "moe/io/checkpoint.h"
#include "moe/io/hf_checkpoint.h"
#include "moe/io/input.h"
#include "moe/io/trace.h"
#include "moe/offload/cache_sim.h"
#include "moe/plan/offload_cache.h"
#include "moe/settings.h"
#include "plan/check.h"
#include "plan/report_text.h"

namespace moe::plan {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A checkpoint's or a JSON file's model config, resolved; `path` names it in the error.
ModelConfig resolved_config(const nlohmann::json& j, const std::string& path) {
  try {
    ModelConfig c = model_config_from_json(j);
    c.resolve();
    return c;
  } catch (const Error& e) {
    throw Error(str(path, ": not a model config: ", e.what()));
  }
}

// A JSON file: our model config, moe-convert inspect --json's report of a checkpoint, or a
// Hugging Face config.json (it has model_type where ours has arch).
ModelConfig read_json_model(const std::string& path) {
  std::ifstream in(path);
  PLAN_CHECK(in.good(), path, ": cannot open the model config");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(path, ": not valid JSON: ", e.what()));
  }
  if (j.is_object() && j.contains("model_type") && !j.contains("arch") &&
      !j.contains("model_config"))
    return io::hf_model_config(path);
  if (j.is_object() && j.contains("model_config")) j = j["model_config"];  // moe-convert inspect
  return resolved_config(j, path);
}

}  // namespace

ModelConfig read_model(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return io::hf_model_config(path);
  io::check_input_file(path, "model");
  if (ends_with(path, ".json")) return read_json_model(path);
  const nlohmann::json j = io::read_model_config(path);
  return resolved_config(j, path);
}

TraceLoads read_trace_loads(const io::TraceReader& reader, const ModelConfig& config) {
  const std::string& path = reader.name();
  const std::vector<int64_t> experts = reader.info().experts;
  std::vector<int64_t> model_experts;
  for (int64_t e : config.experts_per_layer)
    if (e > 0) model_experts.push_back(e);
  PLAN_CHECK(experts == model_experts, path, ": the trace has ", experts.size(), " MoE layers of ",
             experts.empty() ? 0 : experts[0], " experts, the model ", model_experts.size(), " of ",
             model_experts.empty() ? 0 : model_experts[0], ": was it recorded from this model?");
  TraceLoads t;
  t.tokens = reader.batch_tokens();
  const std::vector<int64_t> loads = reader.loads();  // [B, L, Emax]
  const size_t L = experts.size(), Emax = size_t(reader.max_experts());
  for (size_t b = 0; b < t.tokens.size(); ++b) {
    PLAN_CHECK(t.tokens[b] > 0, path, ": batch ", b, " has no token");
    auto& batch = t.loads.emplace_back(L);
    for (size_t l = 0; l < L; ++l)
      for (int64_t e = 0; e < experts[l]; ++e)
        batch[l].push_back(double(loads[(b * L + l) * Emax + size_t(e)]));
  }
  PLAN_CHECK(!t.loads.empty(), path, ": the trace has no batch");
  return t;
}

SearchInputs read_plan_inputs(const std::string& model, const std::string& trace,
                              const std::string& cluster, int64_t batch, int64_t seq,
                              TraceAccesses accesses) {
  PLAN_CHECK(batch >= 1, flag_for(Setting::batch), " must be >= 1");
  SearchInputs in;
  in.model_name = model;
  in.config = read_model(model);
  if (seq > 0) in.config.seq = seq;
  in.cluster = read_cluster_file(cluster);
  const io::TraceReader reader(trace);
  in.trace = read_trace_loads(reader, in.config);
  if (accesses == TraceAccesses::read ||
      (accesses == TraceAccesses::if_cluster_has_ssd && in.cluster.ssd_bytes > 0))
    in.accesses = offload::training_accesses(reader);
  in.tokens_per_rank = batch * in.config.seq;
  return in;
}

Prediction predict_layout(const SearchInputs& in, const Layout& layout) {
  Prediction p;
  p.request.model = in.model_name;
  p.request.layout = layout_text(layout);
  p.config = in.config;
  p.cluster = in.cluster;
  std::vector<int64_t> experts;
  for (int64_t e : in.config.experts_per_layer)
    if (e > 0) experts.push_back(e);
  p.layout = check_layout(layout, in.cluster.ranks(), experts);
  p.tokens_per_rank = in.tokens_per_rank;
  p.active_fraction = in.trace.active_fraction();
  const MemoryInput memory{p.config, p.layout, p.cluster, p.tokens_per_rank, p.active_fraction};
  p.memory = plan_memory(memory);
  StepInput step{p.config, p.layout, p.cluster, p.tokens_per_rank, in.trace};
  if (p.layout.offload == OffloadTier::ssd)
    step.ssd_hit_rate = p.ssd_hit_rate =
        host_cache_hit_rate(in.accesses, experts, p.layout, ssd_cache_experts(memory));
  p.time = predict_step(step);
  return p;
}

Prediction predict(const PredictRequest& r) {
  const Layout layout = parse_layout(r.layout);
  const SearchInputs in = read_plan_inputs(
      r.model, r.trace, r.cluster, r.batch, r.seq,
      layout.offload == OffloadTier::ssd ? TraceAccesses::read : TraceAccesses::no);
  Prediction p = predict_layout(in, layout);
  p.request = r;
  return p;
}

namespace {

constexpr const char* kNoOverhead =
    "the cluster spec has no [overhead] table: non-GEMM work (norms, softmax, routing, dispatch, "
    "loss, per-op costs) is counted as 0, so the step is a lower bound";

// The time terms in report order: name, seconds.
std::vector<std::pair<const char*, double>> time_terms(const StepTime& t) {
  return {{"dense_compute", t.dense_s},
          {"expert_compute", t.expert_s},
          {"expert_compute_balanced", t.expert_balanced_s},
          {"all_to_all", t.a2a_s},
          {"allreduce", t.allreduce_s},
          {"allreduce_exposed", t.allreduce_exposed_s},
          {"zero_gathers", t.zero_gather_s},
          {"optimizer", t.optimizer_s},
          {"optimizer_exposed", t.optimizer_exposed_s},
          {"non_gemm", t.non_gemm_s},
          {"step", t.step_s}};
}

}  // namespace

std::vector<std::string> prediction_tsv(const Prediction& p) {
  std::vector<std::string> lines = {"# moe-plan predict: cluster '" + p.cluster.name + "' (" +
                                        std::to_string(p.cluster.ranks()) + " ranks), layout " +
                                        layout_text(p.layout),
                                    "section\tname\tvalue\tunit"};
  if (!p.cluster.has_overhead) lines.insert(lines.begin() + 1, str("# ", kNoOverhead));
  for (const MemoryItem& m : p.memory.items)
    lines.push_back(str("memory\t", m.tier, ": ", m.what, "\t", tsv_whole(m.bytes), "\tbytes"));
  for (int t = 0; t < 3; ++t) {
    lines.push_back(
        str("tier\t", kTierNames[t], " need\t", tsv_whole(p.memory.need[t]), "\tbytes"));
    lines.push_back(
        str("tier\t", kTierNames[t], " capacity\t", tsv_whole(p.memory.capacity[t]), "\tbytes"));
    if (p.memory.shortfall(t) > 0)
      lines.push_back(str("tier\t", kTierNames[t], " does not fit, short by\t",
                          tsv_whole(p.memory.shortfall(t)), "\tbytes"));
  }
  for (const auto& [name, s] : time_terms(p.time))
    lines.push_back(str("time\t", name, "\t", tsv_number(s), "\ts"));
  if (p.layout.offload == OffloadTier::ssd)
    lines.push_back(
        str("offload\tssd_host_cache_hit_rate\t", tsv_number(p.ssd_hit_rate), "\tfraction"));
  lines.push_back(str("throughput\ttokens_per_s\t", tsv_number(p.time.tokens_per_s), "\ttokens/s"));
  lines.push_back(str("throughput\tfits\t", p.memory.fits() ? 1 : 0, "\tbool"));
  return lines;
}

nlohmann::json prediction_json(const Prediction& p) {
  nlohmann::json memory = nlohmann::json::array();
  for (const MemoryItem& m : p.memory.items)
    memory.push_back({{"tier", m.tier}, {"what", m.what}, {"bytes", m.bytes}});
  nlohmann::json tiers = nlohmann::json::object();
  for (int t = 0; t < 3; ++t)
    tiers[kTierNames[t]] = {{"need_bytes", p.memory.need[t]},
                            {"capacity_bytes", p.memory.capacity[t]},
                            {"short_bytes", std::max(0.0, p.memory.shortfall(t))}};
  nlohmann::json time = nlohmann::json::object();
  for (const auto& [name, s] : time_terms(p.time)) time[std::string(name) + "_s"] = s;
  nlohmann::json overhead = {{"given", p.cluster.has_overhead},
                             {"per_step_s", p.cluster.overhead_per_step},
                             {"per_layer_s", p.cluster.overhead_per_layer},
                             {"elementwise_bytes_per_s", p.cluster.elementwise_bw}};
  if (!p.cluster.has_overhead) overhead["note"] = kNoOverhead;
  return {{"cluster", p.cluster.name},
          {"overhead", overhead},
          {"ranks", p.cluster.ranks()},
          {"layout", layout_text(p.layout)},
          {"tokens_per_rank", p.tokens_per_rank},
          {"active_fraction", p.active_fraction},
          {"ssd_host_cache_hit_rate", p.ssd_hit_rate},
          {"memory", memory},
          {"tiers", tiers},
          {"fits", p.memory.fits()},
          {"time", time},
          {"tokens_per_s", p.time.tokens_per_s}};
}

}  // namespace moe::plan
