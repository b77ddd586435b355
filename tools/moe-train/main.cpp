// moe-train: train an MoE transformer language model. All the work is libmoe's train::Trainer.
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "moe/comm/communicator.h"
#include "moe/cuda.h"
#include "moe/io/checkpoint.h"
#include "moe/io/output.h"
#include "moe/log.h"
#include "moe/profile/popularity.h"
#include "moe/threads.h"
#include "moe/train/run_dir.h"
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

// The config key of a flag: "--d-model" -> "d_model".
std::string flag_key(const CLI::Option* opt) {
  std::string key = opt->get_name().substr(2);
  for (char& c : key)
    if (c == '-') c = '_';
  return key == "vocab" ? "vocab_size" : key;
}

// Model config for this run: from the flags, or from the checkpoint when resuming (flags given
// explicitly must then agree with it).
ModelConfig resolve_model(tools::TrainOptions& o, const io::Checkpoint* resume) {
  ModelConfig m = o.model;
  m.arch = parse_arch(o.arch);
  m.dtype = parse_dtype(o.dtype);
  m.normalize_topk =
      o.normalize_topk == "auto" ? flavour_of(m).normalize_topk : o.normalize_topk == "on";
  if (!resume) {
    m.resolve();
    return m;
  }
  ModelConfig saved = model_config_from_json(resume->model_config);
  bool explicit_flags = false;
  for (CLI::Option* opt : o.model_flags) explicit_flags |= opt->count() > 0;
  if (explicit_flags) {
    m.resolve();
    json a = to_json(m), b = to_json(saved);
    for (CLI::Option* opt : o.model_flags) {
      if (!opt->count()) continue;
      std::string key = flag_key(opt);
      if (a.contains(key) && a[key] != b[key])
        throw UsageError(str("--", opt->get_name().substr(2), " ", a[key].dump(),
                             " contradicts the checkpoint's ", b[key].dump(),
                             " (a resumed run keeps its model)"));
    }
  }
  return saved;
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
  const bool lead = world.rank() == 0;  // rank 0 reports; every rank trains
  if (!lead) {
    o.common.quiet = true;
    o.metrics.clear();
    if (log_level() > LogLevel::warn) set_log_level(LogLevel::warn);
  }
  std::unique_ptr<io::Checkpoint> resume;
  train::TrainConfig tc = o.train;
  tc.seed = o.common.seed;
  const bool sharded_resume = !o.resume.empty() && std::filesystem::is_directory(o.resume);
  if (!o.resume.empty()) {
    // A sharded checkpoint is a directory; its rank-00000.h5 holds the configurations.
    resume = std::make_unique<io::Checkpoint>(io::load_checkpoint(
        sharded_resume ? (std::filesystem::path(o.resume) / "rank-00000.h5").string() : o.resume,
        !sharded_resume));
    // The checkpoint's training config, overridden by flags given now.
    train::TrainConfig given = tc;
    tc = train::train_config_from_json(resume->train_config);
    json now = train::to_json(given), merged = train::to_json(tc);
    for (CLI::Option* opt : o.train_flags) {
      if (!opt->count()) continue;
      std::string key = flag_key(opt);
      if (now.contains(key)) merged[key] = now[key];
    }
    CLI::Option* seed = app.get_option("--seed");
    if (seed->count() && given.seed != tc.seed)
      throw UsageError(str("--seed ", given.seed, " contradicts the checkpoint's seed ", tc.seed));
    tc = train::train_config_from_json(merged, tc);
  }
  if (tc.data.empty()) throw UsageError("--data is required (the text or token file to train on)");

  ModelConfig mc = resolve_model(o, resume.get());
  // One run per directory: checked after the flags, before any work, on every rank (they all
  // see the same --out).
  train::check_run_directory(o.out, o.resume, o.force);
  if (lead)
    for (const std::string& path : io::remove_stale_temporaries(o.out))
      MOE_LOG_WARN("removed ", path, ", left by an interrupted save (its process is gone)");
  bool token_file = io::resolve_token_format(tc.data, io::parse_token_format(tc.data_format)) !=
                    io::TokenFormat::text;
  if (!resume && token_file && !app.get_option("--vocab")->count())
    mc.vocab_size = 0;  // from the data

  // Ranks that disagree would train different models or deadlock in a collective: refuse at start.
  // One check per setting (the key set is the same on every rank), so the error names the setting.
  if (world.size() > 1) {
    json settings = to_json(mc);
    settings.update(train::to_json(tc));
    settings.update(
        json{{"out", o.out}, {"resume", o.resume}, {"checkpoint_every", o.checkpoint_every}});
    for (const auto& [key, value] : settings.items())
      world.check_same_everywhere(str("moe-train setting '", key, "'"), value.dump());
  }
  // The device is checked before any work: a machine without a usable GPU is told so at once.
  // Several ranks on GPUs train over NCCL (the trainer's parallel::Layout bootstraps it over the
  // launcher's MPI world), one GPU per rank.
  const Device device = tools::resolve_device(o.device, &world);
  train::Trainer trainer(mc, tc, io::make_provenance("moe-train", argc, argv), &world, device);
  const comm::Communicator& group = *trainer.layout().world();
  tools::ensure_output_dir(o.out);  // before training: fail now, not at the first checkpoint
  if (resume) {
    if (sharded_resume)
      trainer.restore(o.resume);  // each rank reads the shards holding its parameters
    else
      trainer.restore(*resume);
    MOE_LOG_INFO("resumed from ", o.resume, " at step ", trainer.steps_done());
    resume.reset();
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
                         tc.shard_embedding ? ", sharded embedding" : "", ", ", tc.a2a,
                         " all-to-all, scheduler ", tc.comm_scheduler)
                   : std::string());

  std::unique_ptr<tools::OutputStream> metrics;
  if (!o.metrics.empty()) metrics = std::make_unique<tools::OutputStream>(o.metrics);
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

  double elapsed = 0, ema_rate = 0;
  int64_t first_step = trainer.steps_done();
  std::string last_saved;
  tools::install_stop_handler();
  while (trainer.steps_done() < tc.steps) {
    if (stop_agreed(world)) {
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
    // Every rank captures on the same steps (the flag changes no collective).
    const bool record = !o.trace.empty() && trainer.steps_done() % o.trace_every == 0;
    train::StepStats s = trainer.step(record);
    if (trace && record) {
      Tensor ids = Tensor::from_vector({static_cast<int64_t>(s.token_ids.size())}, s.token_ids);
      trace->append(profile::trace_batch(trace_info, s.forward, ids, s.step));
    }
    elapsed += s.seconds;
    double rate = static_cast<double>(s.tokens) / std::max(s.seconds, 1e-9);
    ema_rate = ema_rate == 0 ? rate : 0.9 * ema_rate + 0.1 * rate;
    bool last = s.step == tc.steps;
    bool do_eval = last || (o.eval_every > 0 && s.step % o.eval_every == 0);
    double val = do_eval ? trainer.evaluate() : NAN;
    double eta =
        elapsed / static_cast<double>(s.step - first_step) * static_cast<double>(tc.steps - s.step);
    char head[160];
    std::snprintf(head, sizeof head,
                  "step %lld/%lld | loss %.4f | aux %.4f | lr %.2e | %s tok/s | ETA %s",
                  static_cast<long long>(s.step), static_cast<long long>(tc.steps), s.forward.loss,
                  s.forward.aux_loss, s.lr, tools::format_rate(ema_rate).c_str(),
                  tools::format_duration(eta).c_str());
    std::string text = head;
    if (do_eval) text += str(" | val ", std::round(val * 1e4) / 1e4);
    if (!s.load_max_over_mean.empty())
      text += " | load max/mean " + join_loads(s.load_max_over_mean) +
              str(" | dropped ", std::round(s.dropped_fraction * 1e4) / 1e2, "%");
    if (do_eval || s.step % o.log_every == 0 || s.step == first_step + 1)
      progress.line(text);
    else
      progress.live(text);
    if (metrics && (do_eval || s.step % o.log_every == 0)) {
      json j{{"step", s.step},
             {"loss", s.forward.loss},
             {"lr", s.lr},
             {"tokens_per_s", rate},
             {"aux_loss", s.forward.aux_loss},
             {"z_loss", s.forward.z_loss},
             {"expert_load_max_over_mean", s.load_max_over_mean},
             {"dropped_fraction", s.dropped_fraction},
             {"grad_norm", s.grad_norm},
             {"tokens_seen", trainer.tokens_seen()}};
      if (world.size() > 1) {
        j["a2a_seconds"] = s.a2a_seconds;
        j["grad_sync_seconds"] = s.grad_sync_seconds;
        j["step_seconds"] = s.seconds;
      }
      if (do_eval) j["val_loss"] = val;
      metrics->write_line(j.dump());
    }
    if (last || (o.checkpoint_every > 0 && s.step % o.checkpoint_every == 0)) {
      last_saved = trainer.save(o.out);
      MOE_LOG_INFO("checkpoint ", last_saved);
    }
  }
  progress.finish();
  if (metrics) metrics->close();
  if (trace) trace->close();
  if (last_saved.empty()) {
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
