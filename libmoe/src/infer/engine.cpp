#include "moe/infer/engine.h"

#include <iterator>
#include <utility>

#include "moe/error.h"
#include "moe/io/checkpoint.h"
#include "moe/io/checkpoint_dir.h"
#include "moe/io/finite.h"
#include "moe/io/trace.h"
#include "moe/log.h"
#include "moe/offload/budget.h"
#include "moe/profile/paths.h"
#include "moe/settings.h"

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

namespace {

// --prefetch and --prefetch-margin against the flags they act through, in the user's words.
void check_prefetch(const EngineOptions& o) {
  using Prefetch = EngineOptions::Prefetch;
  const bool router = o.prefetch == Prefetch::router || o.prefetch == Prefetch::router_output;
  if (o.prefetch_margin < 0)
    throw UsageError(
        str(flag_for(Setting::prefetch_margin), " ", o.prefetch_margin, ": must be 0 or more"));
  if (o.prefetch_margin > 0 && !router)
    throw UsageError(str(flag_for(Setting::prefetch_margin),
                         " widens the router's prediction: give ", flag_for(Setting::prefetch),
                         " router (or router-output)"));
  if (o.prefetch == Prefetch::trace && o.pin_from.empty())
    throw UsageError(str(flag_for(Setting::prefetch), " requires ", flag_for(Setting::pin_from),
                         " (its estimate is the trace's; ", flag_for(Setting::prefetch),
                         " router needs no trace)"));
  if (!router) return;
  const std::string flag = str(flag_for(Setting::prefetch),
                               o.prefetch == Prefetch::router ? " router" : " router-output");
  if (o.budget.empty())
    throw UsageError(str(flag, " reads the next layer's experts into the expert cache: give ",
                         flag_for(Setting::expert_budget), " and ", flag_for(Setting::expert_cache),
                         " lru|lfu"));
  if (!o.expert_cache)
    throw UsageError(str(flag, " reads ahead into the expert cache: give ",
                         flag_for(Setting::expert_cache), " lru|lfu"));
}

// Expert parallelism (ep > 1): as many ranks as ep, no budget yet, Lina's placement on the CPU.
void check_expert_parallel(const EngineOptions& o, const comm::Communicator& world) {
  if (world.size() != o.ep)
    throw UsageError(str(flag_for(Setting::ep), " ", o.ep, " needs ", o.ep, " ranks (mpiexec -n ",
                         o.ep, "); this run has ", world.size()));
  if (!o.budget.empty())
    throw UsageError(str(flag_for(Setting::expert_budget), " and ", flag_for(Setting::ep),
                         " cannot be combined yet"));
  if (!o.popularity.empty() && o.device.kind != Device::cpu)
    throw UsageError(str(flag_for(Setting::popularity), " runs with ", flag_for(Setting::device),
                         " cpu only (the placement reads each batch's routing on the host); "
                         "this run has ",
                         flag_for(Setting::device), " ", o.device_flag));
}

// One rank: the flags of expert parallelism are refused, and the cache's flags need a budget.
void check_one_rank(const EngineOptions& o, const comm::Communicator* world) {
  if (!o.popularity.empty())
    throw UsageError(str(flag_for(Setting::popularity),
                         " places experts over expert-parallel ranks: it needs ",
                         flag_for(Setting::ep), " R under mpiexec -n R (R > 1)"));
  if (world && world->size() > 1)
    throw UsageError(str("moe-infer runs on one rank unless ", flag_for(Setting::ep), " ",
                         world->size(), " spreads the experts over the ", world->size(), " ranks"));
  if (o.budget.empty() && (o.expert_cache || !o.pin_from.empty()))
    throw UsageError(
        str(o.expert_cache ? flag_for(Setting::expert_cache) : flag_for(Setting::pin_from),
            " sets how ", flag_for(Setting::expert_budget), " is served: give a budget too"));
  if (!o.pin_from.empty() && !o.expert_cache)
    throw UsageError(str(flag_for(Setting::pin_from), " pins experts in the expert cache: give ",
                         flag_for(Setting::expert_cache), " lru|lfu"));
}

}  // namespace

std::unique_ptr<Engine> Engine::open(const EngineOptions& options,
                                     std::unique_ptr<comm::Communicator> world) {
  EngineOptions o = options;
  check_prefetch(o);
  // A run directory serves its newest checkpoint (load_model refuses a sharded one, saying so).
  if (const io::CheckpointRef ref = io::resolve_checkpoint(o.model); !ref.sharded)
    o.model = ref.path;
  std::unique_ptr<Engine> engine(new Engine());
  Engine& e = *engine;
  e.device_ = o.device;
  e.model_path_ = o.model;
  if (o.ep > 1) {
    check_expert_parallel(o, *world);
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
        throw Error(str(flag_for(Setting::popularity), " '", o.popularity, "' does not fit model '",
                        o.model, "': ", ex.what()));
      }
      e.parallel_.placement = e.placement_.get();
    }
    e.loaded_ = load_model(o.model, true, &e.parallel_);
    e.loaded_.params->to(e.device_);
    if (e.device_.kind == Device::cpu) lean_for_inference(*e.loaded_.params);
    fold_router_centers(*e.loaded_.params);
    return engine;
  }
  check_one_rank(o, world.get());
  if (o.expert_cache) {
    e.open_expert_cache(o);
  } else if (o.budget.empty()) {
    e.loaded_ = load_model(o.model, true, nullptr, o.weights);
    if (!e.loaded_.quantization.empty() && e.device_.kind != Device::cpu)
      throw UsageError(str("'", o.model, "' is ", e.loaded_.quantization,
                           "-quantised: its kernels run on the CPU only (",
                           flag_for(Setting::device), " cpu)"));
  } else {
    e.loaded_ = load_ring_model(o.model);
    offload::ExpertRing& ring = *e.loaded_.ring;
    offload::RingConfig rc;
    rc.budget_bytes =
        offload::parse_bytes(flag_for(Setting::expert_budget), o.budget, ring.expert_bytes());
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

void Engine::check_weights_finite() const {
  for (const Param* p : std::as_const(*loaded_.params).all()) {
    if (p->offloaded || !p->value.defined()) continue;  // a store's experts: checked as read
    const Tensor& v = p->value;
    io::check_finite(str("'", model_path_, "'"), p->name,
                     v.device().kind == Device::cpu ? v : v.to(Device{}));
  }
}

namespace {

// Popularity [L][E] and transitions [L-1][E][E'] of a routing trace (Lina's path table of length
// 1), checked against the model's MoE layers and experts in words.
void read_trace_tables(const std::string& trace_path, const std::vector<int64_t>& experts,
                       offload::ServingCacheConfig& config) {
  const profile::PathTable table = profile::build_paths(io::TraceReader(trace_path), 1);
  if (table.experts != experts)
    throw Error(str(flag_for(Setting::pin_from), " '", trace_path, "': the trace's ",
                    table.experts.size(), " MoE layers have ", shape_str(table.experts),
                    " experts, the model's ", experts.size(), " have ", shape_str(experts),
                    ": record the trace with this model (moe-profile record)"));
  for (const std::vector<int64_t>& counts : table.marginal)
    config.popularity.emplace_back(counts.begin(), counts.end());
  for (size_t l = 0; l + 1 < experts.size(); ++l) {
    std::vector<std::vector<double>> from(static_cast<size_t>(experts[l]),
                                          std::vector<double>(static_cast<size_t>(experts[l + 1])));
    for (const auto& [path, counts] : table.next[l])
      for (size_t f = 0; f < counts.size(); ++f)
        from[static_cast<size_t>(path.back())][f] += double(counts[f]);
    config.transitions.push_back(std::move(from));
  }
}

}  // namespace

void Engine::open_expert_cache(const EngineOptions& o) {
  if (device_.kind != Device::cpu)
    throw UsageError(str(flag_for(Setting::expert_cache), " runs with ", flag_for(Setting::device),
                         " cpu only; this run has ", flag_for(Setting::device), " ", o.device_flag,
                         " (the ring, without ", flag_for(Setting::expert_cache),
                         ", runs on a GPU)"));
  if (io::resolve_checkpoint(o.model).sharded)
    throw UsageError(str("'", o.model,
                         "' is a sharded checkpoint directory; the expert cache "
                         "reads the experts of one checkpoint file: merge it first "
                         "(moe-convert merge ",
                         o.model, " -o merged.h5)"));
  cache_ = std::make_unique<offload::ServingCache>(o.model);
  parallel_.expert_store = cache_.get();
  loaded_ = load_model(o.model, false, &parallel_);
  offload::ServingCacheConfig cc;
  cc.policy = *o.expert_cache;
  cc.lfu = o.lfu;
  cc.dtype = loaded_.config.dtype;
  cc.pin_share = o.pin_share;
  using Prefetch = EngineOptions::Prefetch;
  cc.prefetch = o.prefetch == Prefetch::trace;
  if (o.prefetch == Prefetch::router || o.prefetch == Prefetch::router_output)
    cc.router = {
        o.prefetch == Prefetch::router ? nn::LookaheadSource::input : nn::LookaheadSource::output,
        o.prefetch_margin};
  const int64_t held = cache_->expert_bytes(cc.dtype);
  cc.budget_bytes = offload::parse_bytes(flag_for(Setting::expert_budget), o.budget, held);
  if (!o.pin_from.empty()) read_trace_tables(o.pin_from, cache_->experts_per_layer(), cc);
  cache_->start(cc);
  const offload::ServingCacheStats s = cache_->stats();
  MOE_LOG_INFO("expert cache (", offload::to_string(cc.policy), "): ", s.slots, " slots and ",
               s.pinned, " pinned experts of ", s.expert_bytes, " bytes, for ", held,
               " expert bytes as held (budget ", cc.budget_bytes, " bytes)");
}

}  // namespace moe::infer
