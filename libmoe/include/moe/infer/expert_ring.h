// Expert offload for inference: the ring memory of MoESys (§III-C2). Only K slots of expert memory
// are resident, each holding one MoE layer's experts (fp32, whatever dtype the checkpoint stores).
// While a layer computes, a loader thread reads the experts of later layers into the other slots;
// when a layer finishes, its slot is released and the layer K MoE layers further on (wrapping round
// to the first layers, for the next forward pass) starts loading into it
// ("calculation-released-load"). Forward passes give bitwise the results of the resident model.
//
// On a CUDA device (RingConfig::device) the slots are device memory: the loader converts a layer
// into one of two pinned host staging buffers and copies it to its slot on a copy stream of its
// own; events order that copy after the compute stream's last use of the slot, and the compute
// stream after the copy, so neither the host hooks nor the loader wait for the GPU to finish.
//
// Shapes: L MoE layers, K slots (1 <= K <= L), E experts of a layer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "moe/device.h"
#include "moe/models/transformer.h"
#include "moe/param.h"

namespace moe::infer {

struct RingConfig {
  // Resident expert memory: K = budget / (largest MoE layer's expert bytes, fp32) slots, K >= 1
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
  // Where the slots live and the model computes: the host (default) or a CUDA device (then the
  // expert Params hold device views of the slots; see ExpertRing for the order of the calls).
  Device device;
};

struct RingStats {
  double compute_seconds = 0;  // time inside blocks (between the before and after hooks)
  double load_seconds = 0;     // loader thread busy reading/converting (on CUDA also queuing
                               // the copy and waiting for a free staging buffer)
  double wait_seconds = 0;     // compute waited for a layer to become resident (on CUDA: for
                               // its copy to be queued; the GPU itself waits on an event)
  double overlap_percent = 0;  // share of load time hidden behind compute: 100 (1 - wait / load)
  int64_t peak_resident_bytes = 0;  // the slots: slots * largest layer's expert bytes (fp32), on
                                    // the ring's device (the two pinned staging buffers on CUDA,
                                    // one slot each, are not counted)
  int64_t slots = 0;
  int64_t layers_loaded = 0;   // layers brought into a slot (from the file or the host cache)
  int64_t bytes_read = 0;      // bytes read from the checkpoint file (as stored)
  int64_t cache_hits = 0;      // layers served by the host cache
  int64_t forward_blocks = 0;  // MoE blocks run through the hooks
};

// Serves the expert parameters of `model` (built in `params`) from `checkpoint` through K slots.
// The constructor drops the resident expert tensors of every MoE layer (value, compute and grad:
// their memory is freed; the expert Params then hold fp32 views of a slot, so shapes stay valid)
// and allocates the K slots once (no expert memory is allocated afterwards). Throws
// moe::UsageError when the budget is smaller than one layer's experts ("--expert-budget B bytes
// is smaller than one MoE layer's experts (N bytes)"), moe::Error when the checkpoint's tensors
// do not match the model (a missing name, another shape, not an expert tensor).
// The non-expert parameters are the caller's (infer::load_model(path, false)). The model must
// not be trained while a ring serves it (expert gradients are gone), and the expert Params hold
// meaningful values only between a block's before and after hooks.
// A loader failure (file gone, checksum) is thrown by the next before hook that needs the layer.
//
// On a CUDA device (config.device), in this order:
//   infer::LoadedModel m = infer::load_model(path, false);   // on the host
//   ExpertRing ring(*m.model, *m.params, path, config);       // slots and expert views on device
//   m.params->to(config.device);                              // the non-expert parameters
// ParamSet::to leaves the expert Params as they are (their f32 values are already on the device,
// and their compute copy is the value itself). The ring throws moe::Error ("expert ring: device
// cuda:N: <why>") when the build has no CUDA backend or the device is not usable, and when an
// expert parameter already lives on another device than config.device. The hooks must run on
// the thread that enqueues the model's work: before() makes that thread's current stream wait for
// the layer's copy, after() records on it when the layer's work is done with the slot.
class ExpertRing {
 public:
  ExpertRing(const Transformer& model, ParamSet& params, const std::string& checkpoint,
             const RingConfig& config);
  ~ExpertRing();  // joins the loader thread
  ExpertRing(const ExpertRing&) = delete;
  ExpertRing& operator=(const ExpertRing&) = delete;

  // Pass to Transformer::evaluate (EvalOptions::hooks) or generation. Forward passes must run
  // one at a time, on one thread.
  const BlockHooks& hooks() const;
  RingStats stats() const;
  void reset_stats();  // counters and times to zero (slots and peak stay)
  // Waits until the loader has nothing queued or loading (the prefetches of the next pass are
  // resident): for tests and benchmarks that want counts or timings of a quiet ring.
  void drain();
  int64_t slots() const;
  int64_t expert_bytes() const;  // all MoE layers' experts, fp32
  int64_t layer_bytes() const;   // the largest MoE layer's experts, fp32: one slot
  int64_t moe_layers() const;    // L

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "123456" (bytes), "512MiB", "1.5GB" (B, KB/MB/GB/TB powers of 1000, KiB/MiB/GiB/TiB powers of
// 1024, case-insensitive), or "25%" of total_expert_bytes; rounded down to whole bytes.
// UsageError naming --expert-budget otherwise (empty, negative, not a number, unknown unit).
int64_t parse_budget(const std::string& text, int64_t total_expert_bytes);

// Every expert tensor of `params` in fp32 (as a ring holds them): what a budget given as a share
// ("25%") is a share of, known before the ring is built.
int64_t ring_expert_bytes(const ParamSet& params);

}  // namespace moe::infer
