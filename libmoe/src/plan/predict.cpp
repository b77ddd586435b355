// moe-plan predict (moe/plan/predict.h): read, check, model, report.
#include "moe/plan/predict.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moe/error.h"
#include "moe/io/checkpoint.h"
#include "moe/io/input.h"
#include "moe/io/trace.h"
#include "moe/offload/cache_sim.h"
#include "moe/plan/offload_cache.h"
#include "plan/check.h"

namespace moe::plan {

ModelConfig read_model(const std::string& path) {
  io::check_input_file(path, "model");
  nlohmann::json j;
  if (path.size() > 5 && path.substr(path.size() - 5) == ".json") {
    std::ifstream in(path);
    PLAN_CHECK(in.good(), path, ": cannot open the model config");
    try {
      in >> j;
    } catch (const nlohmann::json::exception& e) {
      throw Error(str(path, ": not valid JSON: ", e.what()));
    }
    if (j.contains("model_config")) j = j["model_config"];  // moe-convert inspect --json
  } else {
    j = io::read_model_config(path);
  }
  try {
    ModelConfig c = model_config_from_json(j);
    c.resolve();
    return c;
  } catch (const Error& e) {
    throw Error(str(path, ": not a model config: ", e.what()));
  }
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

Prediction predict(const PredictRequest& r) {
  Prediction p;
  p.request = r;
  p.config = read_model(r.model);
  if (r.seq > 0) p.config.seq = r.seq;
  p.cluster = read_cluster_file(r.cluster);
  const io::TraceReader reader(r.trace);
  const TraceLoads trace = read_trace_loads(reader, p.config);
  std::vector<int64_t> moe_experts;
  for (int64_t e : p.config.experts_per_layer)
    if (e > 0) moe_experts.push_back(e);
  p.layout = check_layout(parse_layout(r.layout), p.cluster.ranks(), moe_experts);
  PLAN_CHECK(r.batch >= 1, "--batch must be >= 1");
  p.tokens_per_rank = r.batch * p.config.seq;
  p.active_fraction = trace.active_fraction();
  const MemoryInput memory{p.config, p.layout, p.cluster, p.tokens_per_rank, p.active_fraction};
  p.memory = plan_memory(memory);
  StepInput step{p.config, p.layout, p.cluster, p.tokens_per_rank, trace};
  if (p.layout.offload == OffloadTier::ssd)
    step.ssd_hit_rate = p.ssd_hit_rate = host_cache_hit_rate(
        offload::training_accesses(reader), moe_experts, p.layout, ssd_cache_experts(memory));
  p.time = predict_step(step);
  return p;
}

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string bytes(double v) {  // whole bytes, every digit
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

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
          {"step", t.step_s}};
}

}  // namespace

std::vector<std::string> prediction_tsv(const Prediction& p) {
  std::vector<std::string> lines = {"# moe-plan predict: cluster '" + p.cluster.name + "' (" +
                                        std::to_string(p.cluster.ranks()) + " ranks), layout " +
                                        layout_text(p.layout),
                                    "section\tname\tvalue\tunit"};
  for (const MemoryItem& m : p.memory.items)
    lines.push_back(str("memory\t", m.tier, ": ", m.what, "\t", bytes(m.bytes), "\tbytes"));
  for (int t = 0; t < 3; ++t) {
    lines.push_back(str("tier\t", kTierNames[t], " need\t", bytes(p.memory.need[t]), "\tbytes"));
    lines.push_back(
        str("tier\t", kTierNames[t], " capacity\t", bytes(p.memory.capacity[t]), "\tbytes"));
    if (p.memory.shortfall(t) > 0)
      lines.push_back(str("tier\t", kTierNames[t], " does not fit, short by\t",
                          bytes(p.memory.shortfall(t)), "\tbytes"));
  }
  for (const auto& [name, s] : time_terms(p.time))
    lines.push_back(str("time\t", name, "\t", number(s), "\ts"));
  if (p.layout.offload == OffloadTier::ssd)
    lines.push_back(
        str("offload\tssd_host_cache_hit_rate\t", number(p.ssd_hit_rate), "\tfraction"));
  lines.push_back(str("throughput\ttokens_per_s\t", number(p.time.tokens_per_s), "\ttokens/s"));
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
  return {{"cluster", p.cluster.name},
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
