// Expert offload for inference, one expert at a time: an nn::ExpertStore that keeps a RAM cache of
// experts across tokens and batches, beside the ring of whole layers (moe/offload/expert_ring.h).
// The budget counts the bytes the experts are held in: the model's weight dtype (bf16 stays bf16,
// as the resident model keeps it; only the small bias vectors are widened to f32, as the resident
// model widens them), so "25%" holds a quarter of the experts. A quantised checkpoint's expert
// matrices (q8_0, q4_k, q6_k, mxfp4) are held as the resident model holds them, in their block
// format (offload/checkpoint_experts.h): the budget then counts their stored bytes. Slots are fixed
// (budget / one expert's bytes); offload::ExpertCache (LRU or MoESys's LFU variant) decides which
// expert a miss displaces. An expert missing from the cache is read from the checkpoint
// (io::read_expert, only its chunk) when nn::Experts acquires it; nn::Experts asks for each routed
// expert once per layer and forward pass, and a layer's experts stay in the cache until another
// layer begins, so a batch (even one run by blocks of tokens) reads each of a layer's experts at
// most once when the cache holds the experts the layer routes to.
//
// With a routing trace's popularity (moe-profile record; ServingCacheConfig::popularity) the most
// popular experts, ranked within their layer, are pinned up to a share of the budget: read once at
// start() and never evicted; the rest of the budget is the cache. With the trace's layer-to-layer
// transitions (Lina's path table, path length 1) the store also estimates, when a layer's routing
// is known, which experts the next layer will use (the routed experts' transition counts weighted
// by their rows) and counts how many of the next layer's routed experts the estimate held; with
// ServingCacheConfig::prefetch a loader thread reads the estimated experts into the cache while the
// layer computes (their slots are held until the next layer is done). With ServingCacheConfig::
// router the estimate is instead the next layer's own router applied early to the hidden state
// (nn::ExpertStore::lookahead: the model calls predict()), and those experts are read the same way:
// at the input source while the layer before computes, at the output source while the next
// block's attention does.
//
// Every access of an unpinned expert is recorded, so that stats() can state Belady's hits (the
// offline optimum, moe/offload/cache_sim.h) on the same sequence with the same slots.
// Forward passes give bitwise the results of the resident model: nn::Experts runs the same grouped
// ops on an expert's [1,...] views as on the resident [E,...] Params, whose CPU GEMMs run each
// expert's segment on its own.
//
// Shapes: L MoE layers, E experts of a layer, C cache slots, P pinned experts.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe/nn/expert_store.h"
#include "moe/offload/cache_policy.h"

namespace moe::offload {

struct ServingCacheConfig {
  // Expert memory in bytes as held (pinned and cached together); at least one expert.
  int64_t budget_bytes = 0;
  CachePolicy policy = CachePolicy::lru;
  LfuConfig lfu;  // policy lfu; a "step" is one forward pass
  // The model's weight dtype: f32, bf16 or f16 (floating expert matrices are held in it; a
  // quantised checkpoint's in their format).
  DType dtype = DType::f32;
  // A trace's expert counts [L][E] (empty: nothing pinned) and the share of the budget pinned.
  std::vector<std::vector<double>> popularity;
  double pin_share = 0.5;
  // A trace's transition counts [L-1][E_l][E_l+1]: experts of layer l+1 chosen by tokens whose
  // expert at layer l was e (empty: no estimate of the next layer).
  std::vector<std::vector<std::vector<double>>> transitions;
  // With transitions: read the next layer's estimated experts on a loader thread while a layer
  // computes (false: only count what the estimate would have caught). Off by default: on the
  // bench's model the estimate held 46% of the routed experts and the wrong reads displaced
  // cached experts (docs/PERFORMANCE.md, "Expert cache for serving").
  bool prefetch = false;
  // The next layer's router applied early (source none: not; then the trace's estimate, if any):
  // its top_k + margin experts a token are the estimate, counted and prefetched as above (the
  // most likely first). Needs no trace. On the bench's model it held 56% of the next layer's
  // routed experts from the input source and 80% from the output source, the trace's estimate
  // 46% (docs/PERFORMANCE.md, "Expert cache for serving").
  nn::Lookahead router;
};

struct ServingCacheStats {
  int64_t expert_bytes = 0;  // one expert, as held (the largest layer's)
  int64_t slots = 0;         // C
  int64_t pinned = 0;        // P
  int64_t accesses = 0;      // experts acquired (pinned or not)
  int64_t pinned_hits = 0;   // of them, pinned experts
  CacheStats cache;          // the unpinned accesses through the policy
  int64_t belady_hits = 0;   // Belady's optimum on the same unpinned accesses, C slots
  int64_t experts_read = 0;  // experts read from the checkpoint (pinning included)
  int64_t bytes_read = 0;    // bytes read from the checkpoint (as stored)
  int64_t passes = 0;        // forward passes served
  // The next-layer estimate: routed experts of layers 1..L-1 and how many of them it held.
  int64_t estimate_routed = 0, estimate_hits = 0;
  // Prefetch reads issued, acquires served by a slot a prefetch filled (counted in cache.hits),
  // and prefetched experts displaced (or read over) before any acquire used them.
  int64_t prefetches = 0, prefetch_hits = 0, prefetch_wasted = 0;
  double hit_rate() const {  // pinned and cached hits over every access
    return accesses ? double(pinned_hits + cache.hits) / double(accesses) : 0.0;
  }
  double belady_rate() const {  // the same with Belady's cached hits
    return accesses ? double(pinned_hits + belady_hits) / double(accesses) : 0.0;
  }
  double estimate_rate() const {
    return estimate_routed ? double(estimate_hits) / double(estimate_routed) : 0.0;
  }
};

// Serves the experts of the MoE layers a model adds (nn::Parallel::expert_store), as the ring does:
//   offload::ServingCache cache(path);
//   nn::Parallel view;  view.expert_store = &cache;             // must outlive the model
//   Transformer model(config, params, &view);                   // adds the MoE layers
//   cache.start(config);                                        // then forward passes
// start() checks the checkpoint's expert tensors against the model (name, shape, a floating-point
// dtype or the rows of the format its model_config names), allocates the slots once and reads the
// pinned experts. It throws moe::UsageError for a budget below one expert ("--expert-budget B bytes
// is smaller than one expert (N bytes as held)") and moe::Error for a popularity or transition
// table whose layers or experts are not the model's. Forward passes only, one at a time, one
// thread. A failed read (file gone, checksum, non-finite weights) is thrown by acquire, naming the
// expert; the slot is freed.
class ServingCache final : public nn::ExpertStore {
 public:
  explicit ServingCache(std::string checkpoint);
  ~ServingCache() override;
  ServingCache(const ServingCache&) = delete;
  ServingCache& operator=(const ServingCache&) = delete;

  int add_layer(const nn::ExpertParams& params) override;
  void request(int layer, std::span<const int32_t> experts, std::span<const int32_t> rows,
               nn::Pass pass) override;
  nn::ExpertTensors acquire(int layer, int expert) override;
  nn::ExpertTensors gradients(int layer, int expert) override;
  void release(int layer, int expert) override;
  void gradient_done(int layer, int expert) override;
  nn::Lookahead lookahead() const override;
  void predict(int layer, std::span<const int32_t> experts) override;

  void start(const ServingCacheConfig& config);
  ServingCacheStats stats() const;  // Belady's hits computed here, over the recorded accesses
  int64_t moe_layers() const;
  // Every MoE layer's experts as held in `dtype` (what a budget given as a share is a share of).
  int64_t expert_bytes(DType dtype) const;
  std::vector<int64_t> experts_per_layer() const;
  bool pinned(int layer, int expert) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe::offload
