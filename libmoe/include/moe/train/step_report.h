// How a training run reads to its user: the start-up description (model, data, layout, offload,
// tasks, the flexmoe cost model), each step's progress details and metrics fields, and the events
// of a step (replans) as a line and a metrics record each. Text and JSON only: where it goes (log,
// progress line, metrics stream) is the tool's.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/train/run_loop.h"
#include "moe/train/trainer.h"

namespace moe::train {

// The start-up description, one log line each: "model: ...", "data: ..." (with the rank layout
// when world_size > 1), the offload layout and the tasks when there are. `config` is the run's
// reconciled training config (RunConfig::train).
std::vector<std::string> describe_run(const Trainer& trainer, const TrainConfig& config,
                                      int world_size);

// --placement flexmoe: the cost model the replans use ("flexmoe cost model (profiled in ...)"),
// and its metrics record at the trainer's step ("" and null without one).
std::string describe_cost_model(Trainer& trainer);  // (Trainer::placement() is not const)
nlohmann::json cost_model_record(Trainer& trainer);

// What follows the common fields of a step's progress text: expert loads and drops, rank loads,
// hidden transfers, each task's loss and rate (" | load max/mean 1.20 1.31 | dropped 0.5%").
std::string step_details(const StepStats& stats);

// The events of a step, whatever the log cadence: each replan of the placement and of the tasks'
// allocation, as a progress line and a metrics record.
struct StepEvent {
  std::string line;
  nlohmann::json record;
};
std::vector<StepEvent> step_events(const StepStats& stats, const Trainer& trainer);

// Adds the fields of `stats` beyond the common ones (RunLoop) to a metrics line: timings of a
// distributed run, transfers waited for, -v's breakdown, each task's numbers.
void add_step_metrics(nlohmann::json& line, const StepStats& stats, const Trainer& trainer);

}  // namespace moe::train
