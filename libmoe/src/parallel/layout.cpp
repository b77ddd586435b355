// The rank groups of a run (see moe/parallel/layout.h). Every rank splits in the same order, so
// the collective construction matches everywhere.
#include "moe/parallel/layout.h"

#include "moe/comm/nccl.h"
#include "moe/error.h"
#include "moe/settings.h"

namespace moe::parallel {

// Stream priority of the expert all-to-all (NCCL): above the gradient all-reduce's default 0.
constexpr int kExpertStreamPriority = -1;

// One GPU per rank: several ranks on CUDA devices run their collectives over NCCL, bootstrapped
// over the launcher's world (whose collectives read host memory).
static std::unique_ptr<comm::Communicator> device_communicator(comm::Communicator& world,
                                                               Device device) {
  if (device.kind != Device::cuda || world.size() == 1) return nullptr;
  return comm::make_nccl(world, comm::NcclOptions{device.index, 0});
}

Layout::Layout(comm::Communicator* world, const LayoutConfig& config, Device device)
    : config_(config) {
  const int W = world ? world->size() : 1;
  MOE_USAGE_CHECK(config.ep >= 1, flag_for(Setting::ep), " must be >= 1 (got ", config.ep, ")");
  MOE_USAGE_CHECK(W % config.ep == 0, flag_for(Setting::ep), " ", config.ep,
                  " does not divide the ", W,
                  " ranks (the world is data parallel x expert parallel)");
  MOE_USAGE_CHECK(config.partition_mb > 0, flag_for(Setting::partition_mb), " must be > 0 (got ",
                  config.partition_mb, ")");
  MOE_USAGE_CHECK(config.ranks_per_node >= 0, flag_for(Setting::ranks_per_node),
                  " must be >= 0 (got ", config.ranks_per_node, ")");
  const comm::SchedulerMode mode = config.comm_scheduler;
  const comm::A2AAlgorithm algorithm = config.a2a;
  MOE_USAGE_CHECK(algorithm != comm::A2AAlgorithm::hierarchical || config.ep == 1 ||
                      config.ranks_per_node == 0 || config.ep % config.ranks_per_node == 0,
                  flag_for(Setting::ranks_per_node), " ", config.ranks_per_node,
                  " does not divide the ", flag_for(Setting::ep), " ", config.ep,
                  " expert-parallel ranks (the hierarchical all-to-all runs inside each "
                  "expert-parallel group)");
  world_ = world;
  if (W == 1) return;
  nccl_ = device_communicator(*world, device);
  if (nccl_) world_ = nccl_.get();
  batch_ = world_;
  stats_ = &exchange_stats_;
  const int P = static_cast<int>(config.ep), r = rank();
  if (P > 1) {
    // Ranks [d P, (d + 1) P); on GPUs the expert all-to-all gets a high-priority stream.
    ep_comm_ = world_->split_with_priority(r / P, r, kExpertStreamPriority);
    replicas_ = world_->split(r % P, r);  // the ranks holding the same experts
    exchange_ = std::make_unique<comm::AllToAllV>(*ep_comm_, algorithm,
                                                  static_cast<int>(config.ranks_per_node));
    experts_ = ep_comm_.get();
  }
  if (config.shard_embedding) embedding_ = world_;
  if (mode == comm::SchedulerMode::priority)
    scheduler_ = std::make_unique<comm::CommScheduler>(
        *world_, static_cast<size_t>(config.partition_mb * 1024 * 1024), mode,
        comm::Preemption::caller);
}

std::unique_ptr<Layout> Layout::expert_world(comm::Communicator& world, Device device) {
  std::unique_ptr<Layout> layout(new Layout());
  layout->config_.ep = world.size();
  layout->nccl_ = device_communicator(world, device);  // the exchange moves device rows: NCCL
  layout->world_ = layout->nccl_ ? layout->nccl_.get() : &world;
  layout->experts_ = layout->world_;
  layout->exchange_ =
      std::make_unique<comm::AllToAllV>(*layout->experts_, comm::A2AAlgorithm::flat);
  return layout;
}

Layout::~Layout() = default;

}  // namespace moe::parallel
