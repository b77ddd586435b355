// Expert offload for inference: the ring memory of MoESys (§III-C2), an nn::ExpertStore that
// serves whole layers. Only K slots of expert memory are resident, each holding one MoE layer's
// experts (fp32, whatever floating dtype the checkpoint stores; a quantised checkpoint's matrices
// in their block format, as the resident model holds them: offload/checkpoint_experts.h). While a
// layer computes, a loader thread reads the experts of later layers into the other slots; when a
// layer's experts are released, its slot goes to the layer K MoE layers further on (wrapping round
// to the first layers, for the next forward pass): "calculation-released-load". Forward passes give
// bitwise the results of the resident model: nn::Experts runs the same grouped ops over the slot's
// [E,...] views as over resident Params.
//
// On a CUDA device (RingConfig::device) the slots are device memory: the loader converts a layer
// into one of two pinned host staging buffers and copies it to its slot on a copy stream of its
// own; events order that copy after the compute stream's last use of the slot, and the compute
// stream after the copy, so neither the compute thread nor the loader waits for the GPU to finish.
//
// Shapes: L MoE layers, K slots (1 <= K <= L), E experts of a layer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "moe/device.h"
#include "moe/nn/expert_store.h"

namespace moe::offload {

struct RingConfig {
  // Resident expert memory: K = budget / (largest MoE layer's expert bytes as held: fp32, or a
  // quantised checkpoint's stored bytes) slots, K >= 1
  // (at most L: a budget of every layer keeps them all resident after their first load).
  int64_t budget_bytes = 0;
  // Bounded host cache of recently read layers (LRU, checkpoint dtype bytes); 0 = none.
  int64_t host_cache_bytes = 0;
  // false: naive on-demand (a layer's experts load when the layer is reached, then it computes;
  // nothing is prefetched; a layer still in a slot from before is used as it is).
  bool overlap = true;
  // Nice value of the loader thread (Linux): its CPU work (checksums, copies, conversion) yields
  // to the compute threads, which would otherwise be preempted mid parallel region when the ring
  // shares their cores. 0 = leave it as the process's.
  int loader_nice = 10;
  // Where the slots live and the model computes: the host (default) or a CUDA device.
  Device device;
};

struct RingStats {
  double compute_seconds = 0;  // the experts computing (from acquire_layer to release_layer)
  double load_seconds = 0;     // loader thread busy reading/converting (on CUDA also queuing
                               // the copy and waiting for a free staging buffer)
  double wait_seconds = 0;     // compute waited for a layer to become resident (on CUDA: for
                               // its copy to be queued; the GPU itself waits on an event)
  double overlap_percent = 0;  // share of load time hidden behind compute: 100 (1 - wait / load)
  int64_t peak_resident_bytes = 0;  // the slots: slots * largest layer's expert bytes held, on
                                    // the ring's device (the two pinned staging buffers on CUDA,
                                    // one slot each, are not counted)
  int64_t slots = 0;
  int64_t layers_loaded = 0;  // layers brought into a slot (from the file or the host cache)
  int64_t bytes_read = 0;     // bytes read from the checkpoint file (as stored)
  int64_t cache_hits = 0;     // layers served by the host cache
  int64_t layers_served = 0;  // acquire_layer calls (MoE layers computed)
};

// Serves the experts of the MoE layers a model adds (nn::Parallel::expert_store: their Params are
// Param::offloaded, nothing of them is allocated) from `checkpoint`, through K slots.
//   offload::ExpertRing ring(path);
//   nn::Parallel view;  view.expert_store = &ring;             // must outlive the model
//   Transformer model(config, params, &view);                  // adds the MoE layers, in order
//   ring.start(config);                                        // then forward passes
// (infer::load_ring_model does this for a checkpoint's own model.) start() checks the checkpoint
// holds every expert tensor with the model's shape, allocates the K slots once (no expert memory
// is allocated afterwards) and starts the loader; it throws moe::UsageError when the budget is
// smaller than one layer's experts ("--expert-budget B bytes is smaller than one MoE layer's
// experts (N bytes)"), moe::Error when the checkpoint's tensors do not match the model (a missing
// name, another shape, not an expert tensor) and "expert ring: device cuda:N: <why>" when the
// build has no CUDA backend or the device is not usable (a quantised checkpoint's experts, which
// the CPU kernels read, are refused on a device); after a refusal it may be called again. The ring
// serves forward passes only (a backward pass is refused), one at a time, on one thread. A loader
// failure (file gone, checksum) is thrown by the next acquire_layer that needs the layer.
//
// On a CUDA device the non-expert parameters are moved by the caller (ParamSet::to leaves the
// offloaded experts alone), and the forward passes must run on the thread that enqueues the
// model's work: acquire_layer makes that thread's current stream wait for the layer's copy,
// release_layer records on it when the layer's work is done with the slot.
class ExpertRing final : public nn::ExpertStore {
 public:
  explicit ExpertRing(std::string checkpoint);
  ~ExpertRing() override;  // joins the loader thread
  ExpertRing(const ExpertRing&) = delete;
  ExpertRing& operator=(const ExpertRing&) = delete;

  // nn::ExpertStore, whole layers (whole_layers() is true; the per-expert calls throw).
  int add_layer(const nn::ExpertParams& params) override;
  void request(int layer, std::span<const int32_t> experts, std::span<const int32_t> rows,
               nn::Pass pass) override;
  bool whole_layers() const override { return true; }
  nn::ExpertTensors acquire_layer(int layer) override;
  void release_layer(int layer) override;
  nn::ExpertTensors acquire(int layer, int expert) override;
  nn::ExpertTensors gradients(int layer, int expert) override;
  void release(int layer, int expert) override;
  void gradient_done(int layer, int expert) override;

  void start(const RingConfig& config);
  RingStats stats() const;
  void reset_stats();  // counters and times to zero (slots and peak stay)
  // Waits until the loader has nothing queued or loading (the prefetches of the next pass are
  // resident): for tests and benchmarks that want counts or timings of a quiet ring.
  void drain();
  int64_t slots() const;         // K (0 before start)
  int64_t expert_bytes() const;  // all MoE layers' experts as held (known before start: what a
                                 // budget given as a share, "25%", is a share of)
  int64_t layer_bytes() const;   // the largest MoE layer's experts as held: one slot
  int64_t moe_layers() const;    // L

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe::offload
