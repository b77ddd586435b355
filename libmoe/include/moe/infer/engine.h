// An inference engine: a checkpoint opened for forward passes, with its experts resident, streamed
// through an expert ring (MoESys) under a memory budget, or spread over the ranks of an
// expert-parallel group (optionally placed by Lina's popularity estimator). moe-infer opens one
// from its flags; scoring (moe/infer/score.h) and generation (moe/infer/generate.h) run on it.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/device.h"
#include "moe/infer/model.h"
#include "moe/infer/placement.h"
#include "moe/offload/serving_cache.h"
#include "moe/parallel/layout.h"

namespace moe::infer {

struct EngineOptions {
  std::string model;                // checkpoint file, or a moe-train output directory (its last)
  Device device;                    // resolved by the caller (it makes the device current)
  std::string device_flag = "cpu";  // the --device text, for messages
  // Resident expert memory (offload::parse_bytes: "512MiB", "25%"); empty: every expert resident.
  std::string budget;
  // With a budget: a RAM cache of single experts kept across tokens and batches under this policy
  // (offload::ServingCache, the budget in the bytes the experts are held in) instead of the ring of
  // whole layers; empty: the ring.
  std::optional<offload::CachePolicy> expert_cache;
  offload::LfuConfig lfu;
  // With expert_cache: a routing trace (moe-profile record) whose most popular experts are pinned,
  // up to pin_share of the budget, and whose layer-to-layer transitions estimate the next layer.
  std::string pin_from;
  double pin_share = 0.5;
  // With expert_cache: read the next MoE layer's experts into the cache while a layer computes,
  // as the trace's transitions estimate them (trace: needs pin_from), or as the next layer's
  // router chooses for the hidden state before the layer's MoE block (router) or after it
  // (router_output), top_k + prefetch_margin experts a token.
  enum class Prefetch { off, trace, router, router_output };
  Prefetch prefetch = Prefetch::off;
  int64_t prefetch_margin = 0;
  // How the checkpoint's weights are opened when every expert is resident on one rank: mapped
  // by default (LoadOptions); the ring, the cache and --ep read what they need as before.
  LoadOptions weights{true, false};
  int64_t ep = 1;          // > 1: the experts of every MoE layer spread over the world's ep ranks
  std::string popularity;  // with ep > 1: a path table (moe-profile paths) placing the experts
};

// What tells one model apart from another without reading a tensor, for ranks that must serve
// the same one, as (what, value) pairs, the same whats for every model: for the files of `model`
// (a checkpoint file, or the rank files of a sharded directory) their count, model config, tensor
// count, step, tokens seen, seed, producer (tool, version, git), command line and creation time.
// Files written by different runs, steps or conversions differ in one of them; copies of a file, or
// one file reached by two paths, do not. Throws moe::Error naming a file it cannot read.
std::vector<std::pair<std::string, std::string>> model_identity(const std::string& model);

// The model, with its experts resident, streamed through a ring when a budget is given, or spread
// over the MPI ranks with ep (each rank holds E/R experts of every layer).
class Engine {
 public:
  // Checks the options against the world (UsageError naming the flag: --ep R needs R ranks,
  // --expert-budget and --ep cannot be combined, --popularity needs --ep and the CPU, one rank
  // unless --ep) and, under ep, that every rank was given the same model (model_identity; an
  // Error on every rank naming the first rank that differs), then loads the model onto
  // options.device. The world is kept only with ep > 1.
  // Under ep on CUDA the expert exchange runs over NCCL (bootstrapped over the world).
  // --expert-cache, --pin-from and --prefetch need --expert-budget, --pin-from and --prefetch
  // need --expert-cache, --prefetch trace needs --pin-from, --prefetch-margin needs a router
  // prefetch, and the cache runs on the CPU (UsageErrors naming the flags).
  // Logs the ring's slots (or the cache's) when a budget is given.
  static std::unique_ptr<Engine> open(const EngineOptions& options,
                                      std::unique_ptr<comm::Communicator> world);
  ~Engine();

  const ModelConfig& config() const { return loaded_.config; }
  const Transformer& model() const { return *loaded_.model; }
  const Device& device() const { return device_; }
  // The expert ring serving the experts when a budget was given (the model calls it by itself).
  const offload::ExpertRing* ring() const { return loaded_.ring.get(); }
  // The expert cache serving the experts when EngineOptions::expert_cache was given.
  const offload::ServingCache* expert_cache() const { return cache_.get(); }
  const LinaPlacement* placement() const { return placement_.get(); }
  // The expert-parallel world (null on one rank).
  comm::Communicator* world() const { return world_.get(); }
  int ranks() const { return world_ ? world_->size() : 1; }
  int rank() const { return world_ ? world_->rank() : 0; }
  // Throws moe::Error "'<model>': tensor 'X' holds a non-finite value (NaN at element ...)" for
  // the first resident parameter holding NaN or an infinity; returns when none does. Mapped
  // weights are not scanned when opening (docs/FORMATS.md "Mapped weights"): a caller that meets a
  // NonFiniteOutput calls this first, so the message names the tensor as loading used to.
  // Reads every resident weight (the whole file, for a mapped model): for that error path only.
  void check_weights_finite() const;

 private:
  Engine() = default;
  void open_expert_cache(const EngineOptions& options);  // loaded_ with cache_ serving the experts
  Device device_;
  std::string model_path_;  // the checkpoint file (or sharded directory) the model came from
  std::unique_ptr<comm::Communicator> world_;
  std::unique_ptr<parallel::Layout> layout_;  // ep: the expert group (NCCL on GPUs)
  nn::Parallel parallel_;
  std::unique_ptr<offload::ServingCache> cache_;  // before loaded_: outlives the model
  LoadedModel loaded_;
  std::unique_ptr<LinaPlacement> placement_;  // options.popularity
};

}  // namespace moe::infer
