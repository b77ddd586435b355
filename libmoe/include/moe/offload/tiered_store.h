// The tiered training store (ES-MoE, MoESys): every expert's weights and optimizer state live off
// the compute device, in host memory (`host`) or on an SSD directory behind a bounded host cache
// (`ssd`); a bounded set of device slots holds the fp32 weights compute reads. It implements
// nn::ExpertStore, so nn::Experts runs one expert at a time through it.
//
// One expert's state (a "record", one per layer and expert): for each of its tensors (w1, w2,
// w3, b1, b2 as the layer has them) the storage value (the model's dtype), the fp32 master (only
// when the storage is bf16/f16), AdamW's m and v (fp32) and the gradient (fp32).
//
// The step, as the trainer drives it:
//   begin_step(info)         before each micro-batch's forward
//   forward/backward ...     nn::Experts: request/acquire/release; backward also gradients and
//                            gradient_done. A loader thread uploads the requested experts into
//                            device slots up to prefetch_depth ahead of compute. On the last
//                            micro-batch, gradient_done applies the data-parallel scale, sums
//                            the gradient's squares (for the global norm) and, with
//                            overlap_optimizer, queues the expert's AdamW step on an optimizer
//                            thread that runs while backward goes on (ES-MoE; no staleness).
//   grad_square_sum(param)   the norm's share of an offloaded parameter, summed over its experts
//                            in order exactly as optim::grad_square_sum sums a resident one
//   finish_step(clip_scale)  runs the AdamW step of every expert not yet updated (all of them when
//                            the optimizer could not overlap: a global-norm clip needs every
//                            gradient first), waits for the optimizer thread, checks the new
//                            values are finite. The updates are bitwise those optim::AdamW makes.
//
// Device slots: slots = device_budget / (one expert's fp32 weights); eviction prefers experts
// nobody waits for, least recently used first; the pinned experts (the top pin_fraction by the
// previous step's tokens, ES-MoE) stay resident between forward and backward. An update makes an
// expert's slot stale: it is uploaded again when next used.
//
// On a CUDA device (StoreConfig::device) the slots are GPU memory, filled from pinned staging
// buffers on a copy stream of the store's own and ordered by events (offload/device_copies.h);
// gradients() hands out device buffers (two, beside the slots), which gradient_done downloads to
// pinned memory; the optimizer thread moves each into its record and runs the same CPU AdamW.
// Records, the host cache and the SSD tier are the same on either device.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/device.h"
#include "moe/nn/expert_store.h"
#include "moe/offload/cache_policy.h"
#include "moe/offload/store_settings.h"
#include "moe/offload/tier.h"
#include "moe/optim/adamw.h"

namespace moe::offload {

// The store's configuration: the user's settings, and what its owner resolved from them and from
// the run (the tier of `auto`, the budgets in bytes, where compute runs, the ranks, AdamW's).
struct StoreConfig {
  StoreSettings
      settings;  // pin fraction, prefetch depth, cache policy, ... (settings.tier: as given)
  Tier tier = Tier::host;     // host | ssd (offload::plan resolves `auto`)
  Device device;              // where compute reads the slots: the CPU, or a CUDA device
  int64_t device_budget = 0;  // bytes of device slots (0: the default)
  int64_t host_budget = 0;    // bytes of expert state in host memory (ssd: the host cache; 0: none)
  // ssd under mpiexec: every rank's world (each makes a store), so that the ranks of a node whose
  // --ssd-dir is one disk check their files together against its space (check_shared_ssd_space).
  comm::Communicator* world = nullptr;
  optim::AdamWConfig adamw;
};

// What the trainer tells the store about the micro-batch it starts (begin_step before each
// micro-batch's forward; one optimizer step is the micro-batches from a first to a last).
struct StepInfo {
  bool first_micro_batch = true;
  float lr = 0;                  // this step's learning rate
  int64_t adam_step = 1;         // AdamW's t after this step (bias corrections)
  bool last_micro_batch = true;  // gradients are final after this backward
  float gradient_scale = 1.0f;  // data parallelism: 1/W applied to the final gradient (as GradSync)
  // Other ranks hold the same experts (data-parallel replicas): the gradients are summed over
  // them in complete_gradients(), every expert in order, before the norm; no update overlaps.
  comm::Communicator* replicas = nullptr;
  bool overlap = true;  // optimizer may run during backward (no clipping this step)
};

struct StoreStats {
  int64_t device_slots = 0, slot_bytes = 0;
  int64_t record_bytes = 0;              // all experts' state
  int64_t uploads = 0, upload_hits = 0;  // acquires that needed an upload / found their slot
  int64_t optimizer_overlapped = 0;      // expert updates run during backward
  int64_t optimizer_after = 0;           // expert updates run in finish_step
  double wait_seconds = 0;               // compute waited for an upload
  double load_seconds = 0;               // uploads (any thread) and loader's SSD reads: transfers
  double finish_seconds = 0;             // time in finish_step
  int64_t host_bytes = 0;                // expert state in host memory (ssd: the cache)
  CacheStats cache;                      // ssd: the host cache's hits, misses, write-backs
  int64_t ssd_bytes_read = 0, ssd_bytes_written = 0;
  // Time in the SSD files' reads and writes (write-backs included), summed over the store's
  // threads: compute's, the loader's and the optimizer's.
  double ssd_read_seconds = 0, ssd_write_seconds = 0;
};

class TieredStore final : public nn::ExpertStore {
 public:
  // `params` is the ParamSet the model is built in: the store initialises its experts with the
  // values the resident Params would have (ParamSet::initial_rows).
  TieredStore(const ParamSet& params, const StoreConfig& config);
  ~TieredStore() override;
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  // nn::ExpertStore
  int add_layer(const nn::ExpertParams& params) override;
  void request(int layer, std::span<const int32_t> experts, std::span<const int32_t> rows,
               nn::Pass pass) override;
  nn::ExpertTensors acquire(int layer, int expert) override;
  nn::ExpertTensors gradients(int layer, int expert) override;
  void release(int layer, int expert) override;
  void gradient_done(int layer, int expert) override;

  // After every layer is added: sizes the tiers (UsageError naming the budget and the minimum
  // when one does not fit) and initialises every expert's state.
  void start();
  void begin_step(const StepInfo& info);
  // After the last micro-batch's backward, before grad_square_sum: completes the gradients whose
  // last rows came in an earlier micro-batch (scaled and squared-summed), and with replicas
  // (StepInfo::replicas) sums every expert's gradient over them first (in expert order, the same
  // collectives on every rank).
  void complete_gradients();
  double grad_square_sum(const Param& param) const;
  void finish_step(float clip_scale);

  // Checkpoints, one expert at a time. `what`: "value" (storage dtype), "master", "adam.m",
  // "adam.v" (fp32); a tensor shaped [1, ...] (the expert's slice of the parameter).
  Tensor read(const Param& param, int64_t expert, const std::string& what) const;
  void write(const Param& param, int64_t expert, const std::string& what, const Tensor& slice);

  StoreStats stats() const;
  const StoreConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe::offload
