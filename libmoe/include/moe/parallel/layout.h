// How a run is laid out over ranks: the rank groups and the objects that move data between them,
// built once from the launcher's world and the sizes, shared by training (train::Trainer) and
// inference (moe-infer --ep). The layers see it through nn::Parallel, a view of pointers into it.
//
//   world      every rank; data parallel in training (each rank its share of the global batch).
//              On CUDA devices with W > 1 it is an NCCL communicator bootstrapped over the
//              launcher's world, so the collectives below run on device buffers.
//   experts    the P ranks of this rank's expert-parallel group: ranks [d P, (d + 1) P) in
//              training (high-priority stream on GPUs), the whole world in inference.
//   replicas   the W/P ranks holding the same experts (rank r % P of every group).
//   embedding  the ranks over which the token table is sharded by columns (the world, MoESys).
//
// Shape letters: W ranks of the world, P expert-parallel ranks (P divides W).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe/comm/all_to_all.h"
#include "moe/comm/communicator.h"
#include "moe/comm/scheduler.h"
#include "moe/device.h"

namespace moe::parallel {

// Time and bytes one rank spent in expert-parallel all-to-all (forward and backward). The
// trainer reads and resets it every step.
struct ExchangeStats {
  int64_t calls = 0, bytes = 0;  // token exchanges (counts exchanges not included); payload sent
  double seconds = 0;            // blocked in them, counts exchanges included
  // Per block index (MoE blocks only): seconds from dispatch to combine, forward and backward
  // (the exchanges and the experts' GEMMs: what FlexMoE's cost model predicts, less the sync).
  std::vector<double> moe_seconds;
};

// The sizes of a layout, as moe-train's flags give them (train::TrainConfig holds the same).
struct LayoutConfig {
  int64_t ep = 1;                      // expert-parallel ranks P (divides the world)
  bool shard_embedding = false;        // shard the token table over the world
  comm::A2AAlgorithm a2a = comm::A2AAlgorithm::flat;  // the expert all-to-all
  int64_t ranks_per_node = 0;          // virtual nodes for the hierarchical one (0: real nodes)
  comm::SchedulerMode comm_scheduler = comm::SchedulerMode::off;  // priority: Lina's micro-ops
  double partition_mb = 16.0;          // micro-op size of the priority scheduler
};

class Layout {
 public:
  // Training: the world is W/P data-parallel copies of P expert-parallel ranks. Checks the sizes
  // (moe::UsageError naming the flag), then, with W > 1, builds the groups (collective over
  // `world`; splits in a fixed order on every rank). `world` null or of size 1: one process, no
  // group. `device` CUDA with W > 1: every group is built over NCCL (one GPU per rank).
  // `world` must outlive the layout.
  Layout(comm::Communicator* world, const LayoutConfig& config, Device device = {});
  // Inference with the experts spread over every rank (moe-infer --ep): the world is one expert
  // group (no data parallelism, no split), its exchange the flat all-to-all.
  static std::unique_ptr<Layout> expert_world(comm::Communicator& world, Device device);
  ~Layout();
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;

  // The communicator every collective of the run uses (NCCL on GPUs); null for one process.
  comm::Communicator* world() const { return world_; }
  int size() const { return world_ ? world_->size() : 1; }
  int rank() const { return world_ ? world_->rank() : 0; }
  const LayoutConfig& config() const { return config_; }

  // The ranks whose tokens make up one global batch (null: inference, or one process).
  comm::Communicator* batch() const { return batch_; }
  // This rank's expert-parallel group and its token exchange (null without expert parallelism).
  comm::Communicator* experts() const { return experts_; }
  comm::AllToAllV* exchange() const { return exchange_.get(); }
  // The ranks holding the same experts as this one (null without expert parallelism).
  comm::Communicator* replicas() const { return replicas_.get(); }
  // The group the token table is sharded over (null: replicated).
  comm::Communicator* embedding() const { return embedding_; }
  // Lina's priority scheduler (null: collectives run when called).
  comm::CommScheduler* scheduler() const { return scheduler_.get(); }
  // Accumulates the expert exchanges' time and bytes (training with W > 1; null otherwise).
  ExchangeStats* exchange_stats() { return stats_; }

 private:
  Layout() = default;
  LayoutConfig config_;
  std::unique_ptr<comm::Communicator> nccl_;  // over the launcher's world, on GPUs
  comm::Communicator* world_ = nullptr;
  comm::Communicator* batch_ = nullptr;
  comm::Communicator* experts_ = nullptr;
  comm::Communicator* embedding_ = nullptr;
  std::unique_ptr<comm::Communicator> ep_comm_;   // the P ranks sharing the experts
  std::unique_ptr<comm::Communicator> replicas_;  // the W/P ranks holding the same experts
  std::unique_ptr<comm::AllToAllV> exchange_;
  std::unique_ptr<comm::CommScheduler> scheduler_;
  ExchangeStats exchange_stats_;
  ExchangeStats* stats_ = nullptr;
};

}  // namespace moe::parallel
