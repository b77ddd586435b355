#include "moe/infer/engine.h"

#include <iterator>
#include <utility>

#include "moe/error.h"
#include "moe/io/checkpoint.h"
#include "moe/io/checkpoint_dir.h"
#include "moe/log.h"
#include "moe/offload/budget.h"
#include "moe/profile/paths.h"

namespace moe::infer {

Engine::~Engine() = default;

std::vector<std::pair<std::string, std::string>> model_identity(const std::string& model) {
  const std::vector<std::string> files = io::checkpoint_files({model});
  // The most telling first: the first that differs is the one named.
  std::vector<std::pair<std::string, std::string>> fields = {
      {"file count", std::to_string(files.size())},
      {"config", ""},
      {"tensor count", ""},
      {"step", ""},
      {"tokens seen", ""},
      {"seed", ""},
      {"producer", ""},
      {"command line", ""},
      {"creation time", ""}};
  for (const std::string& file : files) {
    const io::Checkpoint c = io::open_checkpoint_lazy(file, false);  // metadata only
    const io::Provenance& p = c.provenance;
    const std::string values[] = {c.model_config.dump(),
                                  std::to_string(c.params.size()),
                                  std::to_string(c.state.step),
                                  std::to_string(c.state.tokens_seen),
                                  std::to_string(c.state.seed),
                                  str(p.tool, " ", p.version, " (git ", p.git, ")"),
                                  p.argv,
                                  p.time};
    for (size_t i = 0; i < std::size(values); ++i)
      fields[i + 1].second += (fields[i + 1].second.empty() ? "" : "; ") + values[i];
  }
  return fields;
}

std::unique_ptr<Engine> Engine::open(const EngineOptions& options,
                                     std::unique_ptr<comm::Communicator> world) {
  EngineOptions o = options;
  // A run directory serves its newest checkpoint (load_model refuses a sharded one, saying so).
  if (const io::CheckpointRef ref = io::resolve_checkpoint(o.model); !ref.sharded)
    o.model = ref.path;
  std::unique_ptr<Engine> engine(new Engine());
  Engine& e = *engine;
  e.device_ = o.device;
  if (o.ep > 1) {
    if (world->size() != o.ep)
      throw UsageError(str("--ep ", o.ep, " needs ", o.ep, " ranks (mpiexec -n ", o.ep,
                           "); this run has ", world->size()));
    if (!o.budget.empty()) throw UsageError("--expert-budget and --ep cannot be combined yet");
    if (!o.popularity.empty() && e.device_.kind != Device::cpu)
      throw UsageError(
          str("--popularity runs with --device cpu only (the placement reads each "
              "batch's routing on the host); this run has --device ",
              o.device_flag));
    e.world_ = std::move(world);
    // Ranks given different models would score nonsense (each holds a share of "the" experts).
    for (const auto& [what, value] : model_identity(o.model))
      e.world_->check_same_everywhere(str("the model's ", what), value);
    e.layout_ = parallel::Layout::expert_world(*e.world_, e.device_);  // NCCL on GPUs
    e.parallel_ = nn::Parallel::of(*e.layout_);
    if (!o.popularity.empty()) {  // every rank holds every expert; Lina places them per batch
      const ModelConfig mc = model_config_from_json(io::read_model_config(o.model));
      try {
        e.placement_ =
            std::make_unique<LinaPlacement>(profile::load_paths(o.popularity), mc, *e.world_);
      } catch (const Error& ex) {
        throw Error(str("--popularity '", o.popularity, "' does not fit model '", o.model,
                        "': ", ex.what()));
      }
      e.parallel_.placement = e.placement_.get();
    }
    e.loaded_ = load_model(o.model, true, &e.parallel_);
    e.loaded_.params->to(e.device_);
    if (e.device_.kind == Device::cpu) lean_for_inference(*e.loaded_.params);
    fold_router_centers(*e.loaded_.params);
    return engine;
  }
  if (!o.popularity.empty())
    throw UsageError(
        "--popularity places experts over expert-parallel ranks: it needs --ep R "
        "under mpiexec -n R (R > 1)");
  if (world && world->size() > 1)
    throw UsageError(str("moe-infer runs on one rank unless --ep ", world->size(),
                         " spreads the experts over the ", world->size(), " ranks"));
  if (o.budget.empty()) {
    e.loaded_ = load_model(o.model);
    if (!e.loaded_.quantization.empty() && e.device_.kind != Device::cpu)
      throw UsageError(str("'", o.model, "' is ", e.loaded_.quantization,
                           "-quantised: its kernels run on the CPU only (--device cpu)"));
  } else {
    e.loaded_ = load_ring_model(o.model);
    offload::ExpertRing& ring = *e.loaded_.ring;
    offload::RingConfig rc;
    rc.budget_bytes = offload::parse_bytes("--expert-budget", o.budget, ring.expert_bytes());
    rc.device = e.device_;  // slots on the GPU, filled from pinned staging by a copy stream
    ring.start(rc);
    MOE_LOG_INFO("expert ring: ", ring.slots(), " slots for ", ring.expert_bytes(),
                 " expert bytes (budget ", rc.budget_bytes, " bytes)");
  }
  // With a ring: the non-expert parameters (the slots are there). Loaded on the CPU already, a
  // model stays as the loader left it (its 16-bit matrices without f32 copies): ParamSet::to
  // leaves parameters already on the device alone.
  e.loaded_.params->to(e.device_);
  if (e.device_.kind == Device::cpu) lean_for_inference(*e.loaded_.params);
  fold_router_centers(*e.loaded_.params);
  return engine;
}

}  // namespace moe::infer
