// What a training program says about an offloaded run (--offload): the store's layout before step
// 1 and its counters at the end, one log line each, so that moe-train's main stays thin and every
// program built on train::Trainer reports a store the same way.
#pragma once
#include <string>

#include "moe/device.h"
#include "moe/offload/tiered_store.h"
#include "moe/train/trainer.h"

namespace moe::train {

// Refuses --offload other than none on a GPU with more than one rank (UsageError naming the
// flags) before the device is opened: the GPU expert store trains in one process only, and a
// machine without a GPU would otherwise answer with the driver's reason instead of the flag to
// change. One process on a GPU is accepted here (the device itself is checked next).
void check_offload_device(const TrainConfig& config, Device device, int world_size);

// "offload: host tier, experts' state 1.5 MiB in RAM (--host-budget 4 MiB), 3 device slots of
// 12 KiB (--device-budget 36 KiB), prefetch depth 2, pin 25%, expert AdamW after backward
// (--clip 1: ...)": the tier, the budgets and when each expert's update runs.
std::string offload_layout(const TrainConfig& config, const offload::TieredStore& store);

// "offload: 96 uploads, 32 slot hits (25.0%), 48 expert updates during backward, 0 after,
// 0.012 s waiting for uploads, 0.034 s finishing steps": TieredStore::stats() of the run so far.
std::string offload_stats(const offload::StoreStats& stats);

}  // namespace moe::train
