// moe-train: train an MoE transformer language model. All the work is libmoe's: train::Session
// opens the run, train::RunLoop steps it, train/step_report says how it reads.
#include <csignal>

#include "common/ranks.h"
#include "moe/io/output.h"
#include "moe/log.h"
#include "moe/train/offload_report.h"
#include "moe/train/run_loop.h"
#include "moe/train/session.h"
#include "moe/train/step_report.h"
#ifdef MOE_HAVE_MPI
#include "moe/comm/mpi.h"
#endif
#include "options.h"

using namespace moe;
using nlohmann::json;

namespace {

// Every rank agrees on a stop: a signal may reach ranks at different steps, and saving is
// collective.
bool stop_agreed(comm::Communicator& world) {
  if (world.size() == 1) return tools::stop_requested();
  Tensor flag = Tensor::from_vector({1}, std::vector<int32_t>{tools::stop_signal()});
  world.all_reduce(flag, comm::ReduceOp::max);
  return flag.data<int32_t>()[0] != 0;
}

// What a run reports while it steps: progress lines (with -v's breakdown under them) and
// metrics lines.
struct Reporter {
  train::Trainer& trainer;
  tools::Progress progress;
  tools::OutputStream* metrics;
  bool breakdown;  // -v on rank 0: where each step's time goes, summed between printed lines
  StepBreakdown breakdown_sum{};
  int64_t breakdown_steps = 0;

  void log(const train::StepReport& r) {
    const train::StepStats& s = r.stats;
    const std::string text =
        tools::step_line(r, {{"aux", tools::fixed(s.forward.aux_loss)}}) + train::step_details(s);
    if (breakdown) {
      breakdown_sum += s.breakdown;
      ++breakdown_steps;
    }
    r.line ? progress.line(text) : progress.live(text);
    if (r.line && breakdown_steps > 0) {
      progress.line(str("  time per step (", breakdown_steps,
                        breakdown_steps > 1 ? " steps" : " step",
                        "): ", breakdown_sum.describe(static_cast<double>(breakdown_steps))));
      breakdown_sum = {};
      breakdown_steps = 0;
    }
    for (const train::StepEvent& event : train::step_events(s, trainer)) {  // whatever the cadence
      progress.line(event.line);
      if (metrics) metrics->write_line(event.record.dump());
    }
  }
};

int train_run(tools::TrainOptions& o, CLI::App& app, int argc, char** argv,
              comm::Communicator& world) {
  tools::apply_common_options(o.common);
  check_outputs(o, world.rank() == 0);
  check_flags(o, app);
  train::SessionRequest request = session_request(o, app);
  request.provenance = io::make_provenance("moe-train", argc, argv);
  request.check_ranks_agree = [&](const json& s) {
    tools::check_ranks_agree(world, "moe-train", s);
  };
  request.resolve_device = [&](const std::string& d) { return tools::resolve_device(d, &world); };
  request.prepare_out = tools::ensure_output_dir;
  train::Session session = train::Session::open(std::move(request), world);
  train::Trainer& trainer = session.trainer();
  std::unique_ptr<tools::OutputStream> metrics;
  if (!o.metrics.empty())
    metrics = std::make_unique<tools::OutputStream>(o.metrics, /*append=*/!o.resume.empty());
  if (json cost = train::cost_model_record(trainer); metrics && !cost.is_null())
    metrics->write_line(cost.dump());
  Reporter report{trainer, tools::Progress(o.common.quiet), metrics.get(),
                  o.common.verbose > 0 && world.rank() == 0};
  trainer.record_breakdown(report.breakdown, o.breakdown_sync);
  train::RunLoop::Hooks hooks;
  hooks.stop = [&] { return stop_agreed(world); };
  hooks.step = [&] { return session.step(); };
  hooks.log = [&](const train::StepReport& r) { report.log(r); };
  if (metrics)
    hooks.metrics = [&](const train::StepReport& r, json& j) {
      train::add_step_metrics(j, r.stats, trainer);
      metrics->write_line(j.dump());
    };
  std::string start_saved;      // the state before any step, in this run's layout
  if (o.checkpoint_at_start) {  // collective: not inside a log macro that may skip it
    start_saved = trainer.save(o.out);
    MOE_LOG_INFO("checkpoint ", start_saved);
  }
  const int64_t first_step = trainer.steps_done();
  tools::install_stop_handler();
  train::RunLoop loop(trainer, {o.out, o.eval_every, o.checkpoint_every, o.log_every},
                      std::move(hooks));
  const train::RunResult result = loop.run();
  report.progress.finish();  // the store's counters on a line of their own
  if (const offload::TieredStore* store = trainer.expert_store())
    MOE_LOG_INFO(train::offload_stats(store->stats()));
  if (result.stopped && trainer.steps_done() > first_step)
    MOE_LOG_WARN("stopped by signal ", tools::stop_signal(), " at step ", trainer.steps_done(),
                 "; saved ", trainer.save(o.out), " (continue with --resume)");
  if (metrics) metrics->close();
  session.close_trace();
  if (result.stopped) return 128 + (tools::stop_signal() ? tools::stop_signal() : SIGTERM);
  if (result.last_saved.empty() && start_saved.empty())
    MOE_LOG_WARN("nothing to do: the checkpoint is already at step ", trainer.steps_done(),
                 " of --steps ", session.config().train.steps);
  return 0;
}

int run(tools::TrainOptions& o, CLI::App& app, int argc, char** argv) {
  // MPI when started by mpiexec/srun (data parallel over the ranks), else one local process.
  std::unique_ptr<comm::Communicator> world = comm::make_world();
  try {
    return train_run(o, app, argc, argv, *world);
  } catch (const std::exception& e) {
#ifdef MOE_HAVE_MPI
    // One rank failing must end every rank, not leave them waiting in a collective.
    if (world->size() > 1)
      comm::abort_job(str("moe-train: error: ", e.what()),
                      dynamic_cast<const UsageError*>(&e) ? 2 : 1);
#endif
    throw;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "moe-train: train a Mixture-of-Experts transformer language model on text or token files.\n"
      "Writes DIR/step-<8 digits>.h5 checkpoints and keeps DIR/last.h5 pointing at the newest.",
      "moe-train"};
  tools::TrainOptions options;
  tools::add_train_options(app, options);
  return tools::run_tool(
      "moe-train", app, argc, argv, [&] { return run(options, app, argc, argv); },
      tools::Scope::job);
}
