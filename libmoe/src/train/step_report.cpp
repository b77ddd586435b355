#include "moe/train/step_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "moe/error.h"
#include "moe/threads.h"
#include "moe/train/offload_report.h"

namespace moe::train {

using nlohmann::json;

namespace {

std::string fixed(double value, int digits = 4) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

std::string join_loads(const std::vector<double>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%s%.2f", i ? " " : "", v[i]);
    s += buf;
  }
  return s;
}

// "tasks: a (batch 8, weight 1, 2 ranks), ...; allocation a:2 b:1 c:1 ranks".
std::string task_summary(const TaskSet& tasks) {
  std::string text = "tasks:";
  for (size_t t = 0; t < tasks.tasks().size(); ++t) {
    const TaskSpec& spec = tasks.tasks()[t];
    text += str(t ? ", " : " ", spec.name, " (", spec.data, ", batch ", spec.batch, ", weight ",
                spec.weight, ")");
  }
  return text + "; allocation " + describe(tasks.allocation(), tasks.tasks());
}

// ", measured 0.412 ms" for a replan of `block`: the step's slowest expert rank in that layer,
// next to the cost model's prediction (for the step before the plan changed).
std::string measured_text(const StepStats& s, const ModelConfig& model, int64_t block) {
  const std::vector<int64_t> blocks = model.moe_blocks();
  const auto layer =
      static_cast<size_t>(std::find(blocks.begin(), blocks.end(), block) - blocks.begin());
  if (layer >= s.moe_seconds.size() || layer >= s.moe_predicted_seconds.size()) return {};
  return str(" (this step: predicted ", fixed(s.moe_predicted_seconds[layer] * 1e3, 3),
             ", measured ", fixed(s.moe_seconds[layer] * 1e3, 3), " ms)");
}

bool has_cost_model(Trainer& trainer) {
  return trainer.config().placement == PlacementRule::flexmoe && trainer.placement() != nullptr;
}

}  // namespace

std::vector<std::string> describe_run(const Trainer& trainer, const TrainConfig& tc,
                                      int world_size) {
  const ModelConfig& model = trainer.model_config();
  std::vector<std::string> lines;
  lines.push_back(str("model: ", arch_name(model.arch), ", ", model.layers, " layers (",
                      model.num_moe_layers(), " MoE), d_model ", model.d_model, ", ",
                      trainer.model().num_params(), " parameters (",
                      trainer.model().active_params_per_token(), " active per token), dtype ",
                      dtype_name(model.dtype)));
  const comm::Communicator& group = *trainer.layout().world();
  lines.push_back(str(
      "data: ", trainer.train_tokens(), " training tokens, ", trainer.val_tokens(),
      " validation tokens; ", num_threads(), " threads",
      world_size > 1 ? str(" per rank, ", world_size, " ranks (", group.name(),
                           "): ", world_size / tc.ep, "-way data x ", tc.ep, "-way expert parallel",
                           tc.shard_embedding ? ", sharded embedding" : "",
                           tc.placement != PlacementRule::fixed
                               ? str(", placement ", placement_rule_name(tc.placement))
                               : "",
                           ", ", comm::a2a_algorithm_name(tc.a2a), " all-to-all, scheduler ",
                           comm::scheduler_mode_name(tc.comm_scheduler))
                     : std::string()));
  if (const offload::TieredStore* store = trainer.expert_store())
    lines.push_back(offload_layout(tc, *store));
  if (const TaskSet* tasks = trainer.tasks()) lines.push_back(task_summary(*tasks));
  return lines;
}

std::string describe_cost_model(Trainer& trainer) {
  if (!has_cost_model(trainer)) return {};
  // The measured profile, and the model the replans use (the resumed run's own, if any).
  const TrainingPlacement& placement = *trainer.placement();
  const balance::CostProfile& profile = trainer.placement_profile();
  const bool measured = placement.cost().gemm_tokens_per_s == profile.model.gemm_tokens_per_s;
  return str("flexmoe cost model ",
             measured ? str("(profiled in ", fixed(profile.seconds, 3), " s)")
                      : std::string("(the resumed checkpoint's)"),
             ":\n", balance::describe(placement.cost()));
}

json cost_model_record(Trainer& trainer) {
  if (!has_cost_model(trainer)) return nullptr;
  const TrainingPlacement& placement = *trainer.placement();
  return json{{"step", trainer.steps_done()},
              {"cost_profile", balance::to_json(trainer.placement_profile())},
              {"cost_model", balance::to_json(placement.cost())}};
}

std::string step_details(const StepStats& s) {
  std::string text;
  if (!s.load_max_over_mean.empty())
    text += " | load max/mean " + join_loads(s.load_max_over_mean) +
            str(" | dropped ", std::round(s.dropped_fraction * 1e4) / 1e2, "%");
  if (!s.rank_load_max_over_mean.empty())
    text += " | ranks max/mean " + join_loads(s.rank_load_max_over_mean);
  // The share of the step's transfers compute did not wait for (1 - wait / transfer).
  auto hidden = [](double wait, double transfer) {
    return str(std::lround(100 * std::clamp(1 - wait / transfer, 0.0, 1.0)), "%");
  };
  if (s.dense_gather_seconds > 0)
    text += " | gathers hidden " + hidden(s.dense_wait_seconds, s.dense_gather_seconds);
  if (s.expert_load_seconds > 0)
    text += " | loads hidden " + hidden(s.expert_wait_seconds, s.expert_load_seconds);
  for (const TaskStepStats& t : s.tasks)
    text += str(" | ", t.name, " ", fixed(t.loss), " ",
                fixed(double(t.samples) / std::max(s.seconds, 1e-9), 1), "/s");
  return text;
}

std::vector<StepEvent> step_events(const StepStats& s, const Trainer& trainer) {
  std::vector<StepEvent> events;
  for (const Replan& replan : s.replans)
    events.push_back({str("step ", s.step, ": ", describe(replan),
                          measured_text(s, trainer.model_config(), replan.block)),
                      json{{"step", s.step}, {"replan", to_json(replan)}}});
  if (!s.task_replan.empty())
    events.push_back({str("step ", s.step, ": ", s.task_replan),
                      json{{"step", s.step},
                           {"task_replan", s.task_replan},
                           {"allocation", to_json(trainer.tasks()->allocation())}}});
  return events;
}

namespace {

void add_task_metrics(json& j, const StepStats& s) {
  json tasks = json::object();
  for (const TaskStepStats& t : s.tasks)
    tasks[t.name] = {{"loss", t.loss},
                     {"samples", t.samples},
                     {"samples_per_s", double(t.samples) / std::max(s.seconds, 1e-9)},
                     {"seconds", t.seconds}};
  j["tasks"] = tasks;
}

}  // namespace

void add_step_metrics(json& j, const StepStats& s, const Trainer& trainer) {
  if (trainer.world_size() > 1) {
    j["a2a_seconds"] = s.a2a_seconds;
    j["grad_sync_seconds"] = s.grad_sync_seconds;
    j["step_seconds"] = s.seconds;
    if (!s.rank_load_max_over_mean.empty())
      j["rank_load_max_over_mean"] = s.rank_load_max_over_mean;
    if (!s.moe_seconds.empty()) j["moe_seconds"] = s.moe_seconds;
    if (!s.moe_predicted_seconds.empty()) j["moe_predicted_seconds"] = s.moe_predicted_seconds;
  }
  if (trainer.dense_shards() && trainer.dense_shards()->stage() >= 3) {
    j["dense_wait_seconds"] = s.dense_wait_seconds;
    j["dense_gather_seconds"] = s.dense_gather_seconds;
  }
  if (trainer.expert_store()) {
    j["expert_wait_seconds"] = s.expert_wait_seconds;
    j["expert_load_seconds"] = s.expert_load_seconds;
  }
  if (!s.breakdown.empty()) {  // -v: this step's seconds by kind of work
    json parts = json::object();
    for (int i = 0; i < kStepParts; ++i)
      parts[step_part_name(static_cast<StepPart>(i))] = s.breakdown.seconds[static_cast<size_t>(i)];
    j["step_breakdown"] = parts;
    j["gemm_gflop"] = s.breakdown.gemm_flops / 1e9;  // the gemm part's products
  }
  if (!s.tasks.empty()) add_task_metrics(j, s);
}

}  // namespace moe::train
