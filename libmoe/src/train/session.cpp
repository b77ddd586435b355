#include "moe/train/session.h"

#include "core/json_text.h"
#include "io/json_attrs.h"
#include "moe/balance/cost_profile.h"
#include "moe/cuda.h"
#include "moe/io/checkpoint_dir.h"
#include "moe/io/output.h"
#include "moe/log.h"
#include "moe/profile/record.h"
#include "moe/settings.h"
#include "moe/train/offload_report.h"
#include "moe/train/run_dir.h"
#include "moe/train/step_report.h"

namespace moe::train {

using nlohmann::json;

namespace {

// A checkpoint named by --resume or --init, for its configs, position and tokenizer (a sharded
// checkpoint's rank-00000.h5 holds them): expert tensors come back as sources, not read; the
// trainer reads the tensors it needs from the path afterwards.
struct Opened {
  io::CheckpointRef from;
  std::unique_ptr<io::Checkpoint> head;
};

// The types of the train_config attribute's values, checked against what the trainer writes (its
// settings, a FlexMoE placement state with one layer, the cost model of one rank), so that a value
// of the wrong type is refused naming the file, the attribute and the key: "checkpoint 'x.h5':
// attribute 'train_config': \"lr\" must be a number, got null".
void check_train_config(const nlohmann::json& config, const std::string& file) {
  if (config.is_null()) return;  // an imported model (moe-convert) has no training settings
  balance::CostModel one_rank;
  one_rank.gemm_tokens_per_s = one_rank.bandwidth = one_rank.allreduce_bytes_per_s = {0.0};
  json reference = to_json(TrainConfig{});
  const auto state = config.is_object() ? config.find("placement_state") : config.end();
  const bool placed = state != config.end() && !state->is_null();  // null: not flexmoe
  if (placed)
    reference["placement_state"] = {
        {"policy", ""}, {"ranks", 0}, {"layers", json::object()}, {"cost", to_json(one_rank)}};
  std::string wrong = json_type_mismatch(config, reference);
  const json layer_reference = {{"experts", 0}, {"slots_per_rank", 0}, {"slots", {0}}};
  if (wrong.empty() && placed && state->contains("layers"))
    for (const auto& [block, layer] : state->at("layers").items()) {
      wrong = json_type_mismatch(layer, layer_reference);
      if (wrong.empty()) continue;
      // Name the layer's path: "placement_state.layers.3.slots[0]" ("must be ..." alone for a
      // layer that is not an object).
      wrong = wrong.front() == '"' ? str("\"placement_state.layers.", block, ".", wrong.substr(1))
                                   : str("\"placement_state.layers.", block, "\" ", wrong);
      break;
    }
  if (!wrong.empty())
    throw Error(str(io::attribute_place("checkpoint", file, "train_config"), ": ", wrong));
}

// `lazy` (--resume): nothing read yet, the optimizer state included (Trainer::restore reads the
// tensors from this very opening); otherwise (--init) the dense parameters are read.
Opened open_head(const std::string& given, bool lazy) {
  Opened opened;
  if (given.empty()) return opened;
  opened.from = io::resolve_checkpoint(given);
  const std::string file =
      opened.from.sharded ? io::CheckpointDir::rank_file(opened.from.path, 0) : opened.from.path;
  opened.head = std::make_unique<io::Checkpoint>(
      lazy ? io::open_checkpoint_lazy(file)
           : io::load_checkpoint(file, false, [](bool, const std::string&) { return true; }));
  check_train_config(opened.head->train_config, file);
  return opened;
}

// The run's configs: the flags reconciled with the checkpoint resumed or started from, the
// layout fitted to the world; the data file's note for the log after the restore.
RunConfig reconcile(const SessionRequest& request, const Opened& resume, const Opened& init,
                    int world_size, std::string& data_note) {
  RunConfig run =
      init.head ? init_config(*init.head, request.model, request.train, request.given)
                : resume_config(resume.head.get(), request.model, request.train, request.given);
  if (resume.head)  // another number of ranks re-shards on load; the layout flags must fit it
    for (std::string& line : fit_layout(run.train, *resume.head, world_size, request.given))
      run.overrides.push_back(std::move(line));
  // The data file is the checkpoint's (or recorded now): a changed file would not continue the
  // token stream.
  data_note = check_data_file(run.train, resume.head != nullptr, request.data_given);
  MOE_LOG_DEBUG("model config: ", to_json(run.model).dump());
  MOE_LOG_DEBUG("training config: ", to_json(run.train).dump());
  const ModelConfig& mc = run.model;
  if (!resume.head && !init.head && mc.num_moe_layers() == 0 && !request.experts_listed)
    MOE_LOG_WARN("the model has no MoE layer (", flag_for(Setting::layers), " ", mc.layers,
                 " with ", flag_for(Setting::moe_every), " ", mc.moe_every, ": every ",
                 mc.moe_every, "th layer is MoE): this trains a dense transformer");
  return run;
}

// One run per directory, and ranks that agree: checked before any work, on every rank (they all
// see the same directory). Ranks that disagree would train different models or deadlock in a
// collective; one check per setting, so the error names the setting.
void check_run(const SessionRequest& request, const RunConfig& run, const Opened& resume,
               comm::Communicator& world) {
  check_run_directory(request.out, resume.from.path, request.force);
  if (world.rank() == 0)
    for (const std::string& path : io::remove_stale_temporaries(request.out))
      MOE_LOG_WARN("removed ", path, ", left by an interrupted save (its process is gone)");
  if (world.size() > 1) {
    json settings = to_json(run.model);
    settings.update(to_json(run.train));
    settings.update(json{{"out", request.out},
                         {"resume", request.resume},
                         {"init", request.init},
                         {"checkpoint_every", request.checkpoint_every}});
    request.check_ranks_agree(settings);
  }
}

}  // namespace

Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;
Session::~Session() = default;

Session Session::open(SessionRequest request, comm::Communicator& world) {
  Session session;
  Opened resume = open_head(request.resume, true);
  Opened init = open_head(request.init, false);  // its model config here, its weights below
  std::string data_note;
  session.config_ = reconcile(request, resume, init, world.size(), data_note);
  const RunConfig& run = session.config_;
  check_run(request, run, resume, world);
  // The device is checked before any work: a machine without a usable GPU is told so at once.
  // Several ranks on GPUs train over NCCL (the trainer's parallel::Layout bootstraps it over the
  // launcher's MPI world), one GPU per rank.
  check_offload_device(run.train, Device::parse(request.device),
                       world.size());  // before the driver
  const Device device = request.resolve_device(request.device);
  // The model's tokenizer (of the checkpoint resumed or started from) reads text data.
  const io::StoredTokenizer* tokenizer = init.head     ? &init.head->tokenizer
                                         : resume.head ? &resume.head->tokenizer
                                                       : nullptr;
  session.trainer_ = std::make_unique<Trainer>(run.model, run.train, request.provenance, &world,
                                               device, tokenizer);
  Trainer& trainer = *session.trainer_;
  request.prepare_out(request.out);  // before training: fail now, not at the first checkpoint
  if (resume.head) {
    // A file, or the shards of a sharded directory holding this rank's parameters; the file
    // opened above is read, not opened again.
    trainer.restore(resume.from.path, std::move(*resume.head));
    MOE_LOG_INFO("resumed from ", request.resume, " at step ", trainer.steps_done());
    for (const std::string& line : run.overrides) MOE_LOG_INFO("resume: ", line);
    if (!data_note.empty()) MOE_LOG_WARN(data_note);
    resume.head.reset();
  }
  if (init.head) {
    trainer.initialize(init.from.path);
    MOE_LOG_INFO("initialised from ", request.init, " (its step ", init.head->state.step,
                 "): fresh optimizer, step 0");
    init.head.reset();
  }
  if (device.kind == Device::cuda) {
    trainer.to_device(device);
    MOE_LOG_INFO("device: ", device.str(), " (", cuda::device_name(device.index), ")");
  }
  for (const std::string& line : describe_run(trainer, run.train, world.size())) MOE_LOG_INFO(line);
  if (std::string cost = describe_cost_model(trainer); !cost.empty()) MOE_LOG_INFO(cost);
  // Routing trace (rank 0 records its own tokens; the loads are the global batch's).
  if (!request.trace.empty() && world.rank() == 0) {
    session.trace_info_ = profile::trace_info(trainer.model_config(), request.provenance, "train");
    if (session.trace_info_.moe_blocks.empty())
      throw UsageError(str(flag_for(Setting::trace), ": the model has no MoE layer to trace"));
    session.trace_ = std::make_unique<io::TraceWriter>(request.trace, session.trace_info_);
  }
  session.request_ = std::move(request);
  return session;
}

StepStats Session::step() {
  // Every rank captures on the same steps (the flag changes no collective).
  const bool record = !request_.trace.empty() && trainer_->steps_done() % request_.trace_every == 0;
  StepStats s = trainer_->step(record);
  if (trace_ && record) {
    Tensor ids = Tensor::from_vector({static_cast<int64_t>(s.token_ids.size())}, s.token_ids);
    trace_->append(profile::trace_batch(trace_info_, s.forward, ids, s.step));
  }
  return s;
}

void Session::close_trace() {
  if (trace_) trace_->close();
}

}  // namespace moe::train
