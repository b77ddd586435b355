// moe-train: train an MoE transformer language model. All the work is libmoe's train::Trainer.
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/ranks.h"
#include "moe/comm/communicator.h"
#include "moe/cuda.h"
#include "moe/io/checkpoint.h"
#include "moe/io/checkpoint_dir.h"
#include "moe/io/output.h"
#include "moe/log.h"
#include "moe/profile/record.h"
#include "moe/step_breakdown.h"
#include "moe/threads.h"
#include "moe/train/offload_report.h"
#include "moe/train/resume.h"
#include "moe/train/run_dir.h"
#include "moe/train/run_loop.h"
#ifdef MOE_HAVE_MPI
#include "moe/comm/mpi.h"
#endif
#include "options.h"

using namespace moe;
using nlohmann::json;

namespace {

std::string join_loads(const std::vector<double>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%s%.2f", i ? " " : "", v[i]);
    s += buf;
  }
  return s;
}

// ", measured 0.412 ms" for a replan of `block`: the step's slowest expert rank in that layer,
// next to the cost model's prediction (for the step before the plan changed).
std::string measured_text(const train::StepStats& s, const ModelConfig& model, int64_t block) {
  const std::vector<int64_t> blocks = model.moe_blocks();
  const auto layer =
      static_cast<size_t>(std::find(blocks.begin(), blocks.end(), block) - blocks.begin());
  if (layer >= s.moe_seconds.size() || layer >= s.moe_predicted_seconds.size()) return {};
  return str(" (this step: predicted ", tools::fixed(s.moe_predicted_seconds[layer] * 1e3, 3),
             ", measured ", tools::fixed(s.moe_seconds[layer] * 1e3, 3), " ms)");
}

// The model and training flags given explicitly (a resumed run reconciles them with its
// checkpoint).
train::GivenFlags given_flags(const tools::TrainOptions& o, CLI::App& app) {
  train::GivenFlags given;
  for (const CLI::Option* opt : o.model_flags)
    if (opt->count()) given.model.push_back(opt->get_name());
  for (const CLI::Option* opt : o.train_flags)
    if (opt->count()) given.train.push_back(opt->get_name());
  given.seed = app.get_option("--seed")->count() > 0;
  return given;
}

// "tasks: a (batch 8, weight 1, 2 ranks), ...; allocation a:2 b:1 c:1 ranks".
std::string task_summary(const train::TaskSet& tasks) {
  std::string text = "tasks:";
  for (size_t t = 0; t < tasks.tasks().size(); ++t) {
    const train::TaskSpec& spec = tasks.tasks()[t];
    text += str(t ? ", " : " ", spec.name, " (", spec.data, ", batch ", spec.batch, ", weight ",
                spec.weight, ")");
  }
  return text + "; allocation " + train::describe(tasks.allocation(), tasks.tasks());
}

// Every rank agrees on a stop: a signal may reach ranks at different steps, and saving is
// collective.
bool stop_agreed(comm::Communicator& world) {
  if (world.size() == 1) return tools::stop_requested();
  Tensor flag = Tensor::from_vector({1}, std::vector<int32_t>{tools::stop_signal()});
  world.all_reduce(flag, comm::ReduceOp::max);
  return flag.data<int32_t>()[0] != 0;
}

int train_run(tools::TrainOptions& o, CLI::App& app, int argc, char** argv,
              comm::Communicator& world) {
  tools::apply_common_options(o.common);
  tools::check_one_stdout({{"--metrics", o.metrics}, {"--trace", o.trace}});
  const bool lead = world.rank() == 0;  // rank 0 reports; every rank trains
  if (lead) {  // rank 0's outputs: an existing file only with --force, before any work
    if (o.resume.empty()) io::check_output_stream(o.metrics, o.force);  // a resume appends
    io::check_output_stream(o.trace, o.force);
  }
  if (!lead) {
    o.common.quiet = true;
    o.metrics.clear();
    if (log_level() > LogLevel::warn) set_log_level(LogLevel::warn);
  }
  std::unique_ptr<io::Checkpoint> resume;
  io::CheckpointRef resume_from;  // a run directory resumes from its newest checkpoint
  if (!o.resume.empty()) {
    resume_from = io::resolve_checkpoint(o.resume);
    // The configurations and the position only (a sharded checkpoint's rank-00000.h5 holds
    // them): expert tensors come back as sources, not read; Trainer::restore(path) below reads
    // the tensors, the offloaded experts one at a time.
    resume = std::make_unique<io::Checkpoint>(io::load_checkpoint(
        resume_from.sharded ? io::CheckpointDir::rank_file(resume_from.path, 0) : resume_from.path,
        false, [](bool, const std::string&) { return true; }));
  }
  std::unique_ptr<io::Checkpoint> init;  // --init: its model config here, its weights below
  io::CheckpointRef init_from;
  if (!o.init.empty()) {
    init_from = io::resolve_checkpoint(o.init);
    init = std::make_unique<io::Checkpoint>(io::load_checkpoint(
        init_from.sharded ? io::CheckpointDir::rank_file(init_from.path, 0) : init_from.path, false,
        [](bool, const std::string&) { return true; }));
  }
  ModelConfig flags_model = o.model;
  flags_model.arch = parse_arch(o.arch);
  flags_model.router_scoring = parse_router_scoring(o.router);
  flags_model.dtype = parse_dtype(o.dtype);
  flags_model.normalize_topk = o.normalize_topk == "auto" ? flavour_of(flags_model).normalize_topk
                                                          : o.normalize_topk == "on";
  // Each task's batch is in its tasks file: a --batch beside --tasks would be ignored.
  if (!o.train.tasks.empty() && app.get_option("--batch")->count())
    throw UsageError("--batch does not apply with --tasks: each task's batch is in " +
                     o.train.tasks + " (the step's batch is their total)");
  if (o.breakdown_sync && o.common.verbose == 0)
    throw UsageError("--breakdown-sync times the step breakdown that -v prints: add -v");
  if (o.breakdown_sync && Device::parse(o.device).kind != Device::cuda)
    throw UsageError(
        "--breakdown-sync applies to --device cuda (on the CPU every part of -v's "
        "breakdown is already its own time)");
  train::TrainConfig flags_train = o.train;
  flags_train.seed = o.common.seed;
  const train::GivenFlags given = given_flags(o, app);
  train::RunConfig run = init ? train::init_config(*init, flags_model, flags_train, given)
                              : train::resume_config(resume.get(), flags_model, flags_train, given);
  if (resume)  // another number of ranks re-shards on load; the layout flags must fit it
    for (std::string& line : train::fit_layout(run.train, *resume, world.size(), given))
      run.overrides.push_back(std::move(line));
  // The data file is the checkpoint's (or recorded now): a changed file would not continue the
  // token stream.
  const std::string data_note =
      train::check_data_file(run.train, resume != nullptr, app.get_option("--data")->count() > 0);
  const ModelConfig& mc = run.model;
  const train::TrainConfig& tc = run.train;
  MOE_LOG_DEBUG("model config: ", to_json(mc).dump());
  MOE_LOG_DEBUG("training config: ", train::to_json(tc).dump());
  if (!resume && !init && mc.num_moe_layers() == 0 &&
      !app.get_option("--experts-per-layer")->count())
    MOE_LOG_WARN("the model has no MoE layer (--layers ", mc.layers, " with --moe-every ",
                 mc.moe_every, ": every ", mc.moe_every,
                 "th layer is MoE): this trains a dense transformer");
  // One run per directory: checked after the flags, before any work, on every rank (they all
  // see the same --out).
  train::check_run_directory(o.out, resume_from.path, o.force);
  if (lead)
    for (const std::string& path : io::remove_stale_temporaries(o.out))
      MOE_LOG_WARN("removed ", path, ", left by an interrupted save (its process is gone)");

  // Ranks that disagree would train different models or deadlock in a collective: refuse at start.
  // One check per setting, so the error names the setting.
  if (world.size() > 1) {
    json settings = to_json(mc);
    settings.update(train::to_json(tc));
    settings.update(json{{"out", o.out},
                         {"resume", o.resume},
                         {"init", o.init},
                         {"checkpoint_every", o.checkpoint_every}});
    tools::check_ranks_agree(world, "moe-train", settings);
  }
  // The device is checked before any work: a machine without a usable GPU is told so at once.
  // Several ranks on GPUs train over NCCL (the trainer's parallel::Layout bootstraps it over the
  // launcher's MPI world), one GPU per rank.
  train::check_offload_device(tc, Device::parse(o.device), world.size());  // before the driver
  const Device device = tools::resolve_device(o.device, &world);
  // The model's tokenizer (of the checkpoint resumed or started from) reads text data.
  const io::StoredTokenizer* tokenizer = init     ? &init->tokenizer
                                         : resume ? &resume->tokenizer
                                                  : nullptr;
  train::Trainer trainer(mc, tc, io::make_provenance("moe-train", argc, argv), &world, device,
                         tokenizer);
  const comm::Communicator& group = *trainer.layout().world();
  tools::ensure_output_dir(o.out);  // before training: fail now, not at the first checkpoint
  if (resume) {
    // A file, or the shards of a sharded directory holding this rank's parameters.
    trainer.restore(resume_from.path);
    MOE_LOG_INFO("resumed from ", o.resume, " at step ", trainer.steps_done());
    for (const std::string& line : run.overrides) MOE_LOG_INFO("resume: ", line);
    if (!data_note.empty()) MOE_LOG_WARN(data_note);
    resume.reset();
  }
  if (init) {
    trainer.initialize(init_from.path);
    MOE_LOG_INFO("initialised from ", o.init, " (its step ", init->state.step,
                 "): fresh optimizer, step 0");
    init.reset();
  }
  if (device.kind == Device::cuda) {
    trainer.to_device(device);
    MOE_LOG_INFO("device: ", device.str(), " (", cuda::device_name(device.index), ")");
  }
  const ModelConfig& model = trainer.model_config();
  MOE_LOG_INFO("model: ", arch_name(model.arch), ", ", model.layers, " layers (",
               model.num_moe_layers(), " MoE), d_model ", model.d_model, ", ",
               trainer.model().num_params(), " parameters (",
               trainer.model().active_params_per_token(), " active per token), dtype ",
               dtype_name(model.dtype));
  MOE_LOG_INFO("data: ", trainer.train_tokens(), " training tokens, ", trainer.val_tokens(),
               " validation tokens; ", num_threads(), " threads",
               world.size() > 1
                   ? str(" per rank, ", world.size(), " ranks (", group.name(),
                         "): ", world.size() / tc.ep, "-way data x ", tc.ep, "-way expert parallel",
                         tc.shard_embedding ? ", sharded embedding" : "",
                         tc.placement != "static" ? ", placement " + tc.placement : "", ", ",
                         tc.a2a, " all-to-all, scheduler ", tc.comm_scheduler)
                   : std::string());
  if (const offload::TieredStore* store = trainer.expert_store())
    MOE_LOG_INFO(train::offload_layout(tc, *store));
  if (const train::TaskSet* tasks = trainer.tasks()) MOE_LOG_INFO(task_summary(*tasks));

  std::unique_ptr<tools::OutputStream> metrics;
  if (!o.metrics.empty())
    metrics = std::make_unique<tools::OutputStream>(o.metrics, /*append=*/!o.resume.empty());
  if (tc.placement == "flexmoe" && trainer.placement()) {
    // The measured profile, and the model the replans use (the resumed run's own, if any).
    const balance::CostProfile& profile = trainer.placement_profile();
    const bool measured =
        trainer.placement()->cost().gemm_tokens_per_s == profile.model.gemm_tokens_per_s;
    MOE_LOG_INFO("flexmoe cost model ",
                 measured ? str("(profiled in ", tools::fixed(profile.seconds, 3), " s)")
                          : std::string("(the resumed checkpoint's)"),
                 ":\n", balance::describe(trainer.placement()->cost()));
    if (metrics)
      metrics->write_line(json{{"step", trainer.steps_done()},
                               {"cost_profile", balance::to_json(profile)},
                               {"cost_model", balance::to_json(trainer.placement()->cost())}}
                              .dump());
  }
  // Routing trace (rank 0 records its own tokens; the loads are the global batch's).
  std::unique_ptr<io::TraceWriter> trace;
  io::TraceInfo trace_info;
  if (!o.trace.empty() && lead) {
    trace_info = profile::trace_info(model, io::make_provenance("moe-train", argc, argv), "train");
    if (trace_info.moe_blocks.empty())
      throw UsageError("--trace: the model has no MoE layer to trace");
    trace = std::make_unique<io::TraceWriter>(o.trace, trace_info);
  }
  tools::Progress progress(o.common.quiet);
  // -v: where each step's time goes (moe/step_breakdown.h), summed over the steps since the last
  // printed line and printed as seconds per step and shares under it.
  const bool breakdown = o.common.verbose > 0 && lead;
  trainer.record_breakdown(breakdown, o.breakdown_sync);
  StepBreakdown breakdown_sum;
  int64_t breakdown_steps = 0;

  train::RunLoop::Hooks hooks;
  hooks.stop = [&] { return stop_agreed(world); };
  hooks.step = [&] {
    // Every rank captures on the same steps (the flag changes no collective).
    const bool record = !o.trace.empty() && trainer.steps_done() % o.trace_every == 0;
    train::StepStats s = trainer.step(record);
    if (trace && record) {
      Tensor ids = Tensor::from_vector({static_cast<int64_t>(s.token_ids.size())}, s.token_ids);
      trace->append(profile::trace_batch(trace_info, s.forward, ids, s.step));
    }
    return s;
  };
  hooks.log = [&](const train::StepReport& r) {
    const train::StepStats& s = r.stats;
    std::string text = tools::step_line(r, {{"aux", tools::fixed(s.forward.aux_loss)}});
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
    for (const train::TaskStepStats& t : s.tasks)
      text += str(" | ", t.name, " ", tools::fixed(t.loss), " ",
                  tools::fixed(double(t.samples) / std::max(s.seconds, 1e-9), 1), "/s");
    if (breakdown) {
      breakdown_sum += s.breakdown;
      ++breakdown_steps;
    }
    if (r.line)
      progress.line(text);
    else
      progress.live(text);
    if (r.line && breakdown_steps > 0) {
      progress.line(str("  time per step (", breakdown_steps,
                        breakdown_steps > 1 ? " steps" : " step",
                        "): ", breakdown_sum.describe(static_cast<double>(breakdown_steps))));
      breakdown_sum = {};
      breakdown_steps = 0;
    }
    for (const train::Replan& replan : s.replans) {  // every replan, whatever --log-every
      progress.line(str("step ", s.step, ": ", train::describe(replan),
                        measured_text(s, trainer.model_config(), replan.block)));
      if (metrics)
        metrics->write_line(json{{"step", s.step}, {"replan", train::to_json(replan)}}.dump());
    }
    if (!s.task_replan.empty()) {  // whatever --log-every
      progress.line(str("step ", s.step, ": ", s.task_replan));
      if (metrics)
        metrics->write_line(json{{"step", s.step},
                                 {"task_replan", s.task_replan},
                                 {"allocation", train::to_json(trainer.tasks()->allocation())}}
                                .dump());
    }
  };
  if (metrics)
    hooks.metrics = [&](const train::StepReport& r, json& j) {
      if (world.size() > 1) {
        j["a2a_seconds"] = r.stats.a2a_seconds;
        j["grad_sync_seconds"] = r.stats.grad_sync_seconds;
        j["step_seconds"] = r.stats.seconds;
        if (!r.stats.rank_load_max_over_mean.empty())
          j["rank_load_max_over_mean"] = r.stats.rank_load_max_over_mean;
        if (!r.stats.moe_seconds.empty()) j["moe_seconds"] = r.stats.moe_seconds;
        if (!r.stats.moe_predicted_seconds.empty())
          j["moe_predicted_seconds"] = r.stats.moe_predicted_seconds;
      }
      if (trainer.dense_shards() && trainer.dense_shards()->stage() >= 3) {
        j["dense_wait_seconds"] = r.stats.dense_wait_seconds;
        j["dense_gather_seconds"] = r.stats.dense_gather_seconds;
      }
      if (trainer.expert_store()) {
        j["expert_wait_seconds"] = r.stats.expert_wait_seconds;
        j["expert_load_seconds"] = r.stats.expert_load_seconds;
      }
      if (!r.stats.breakdown.empty()) {  // -v: this step's seconds by kind of work
        json parts = json::object();
        for (int i = 0; i < kStepParts; ++i)
          parts[step_part_name(static_cast<StepPart>(i))] =
              r.stats.breakdown.seconds[static_cast<size_t>(i)];
        j["step_breakdown"] = parts;
        j["gemm_gflop"] = r.stats.breakdown.gemm_flops / 1e9;  // the gemm part's products
      }
      if (!r.stats.tasks.empty()) {
        json tasks = json::object();
        for (const train::TaskStepStats& t : r.stats.tasks)
          tasks[t.name] = {{"loss", t.loss},
                           {"samples", t.samples},
                           {"samples_per_s", double(t.samples) / std::max(r.stats.seconds, 1e-9)},
                           {"seconds", t.seconds}};
        j["tasks"] = tasks;
      }
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
  progress.finish();  // the store's counters on a line of their own
  if (const offload::TieredStore* store = trainer.expert_store())
    MOE_LOG_INFO(train::offload_stats(store->stats()));
  std::string last_saved = result.last_saved;
  if (result.stopped) {
    progress.finish();
    if (trainer.steps_done() > first_step) {
      last_saved = trainer.save(o.out);
      MOE_LOG_WARN("stopped by signal ", tools::stop_signal(), " at step ", trainer.steps_done(),
                   "; saved ", last_saved, " (continue with --resume)");
    }
    if (metrics) metrics->close();
    if (trace) trace->close();
    return 128 + (tools::stop_signal() ? tools::stop_signal() : SIGTERM);
  }
  progress.finish();
  if (metrics) metrics->close();
  if (trace) trace->close();
  if (last_saved.empty() && start_saved.empty()) {
    MOE_LOG_WARN("nothing to do: the checkpoint is already at step ", trainer.steps_done(),
                 " of --steps ", tc.steps);
  }
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
