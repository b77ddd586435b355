// The all-to-all-v that carries expert-parallel traffic, by algorithm: flat (one
// Communicator::all_to_all_v over the group, every rank talking to every other) or hierarchical
// (HierarchicalAllToAll, two phases through the nodes). Both give the same rows bitwise; the flat
// one is the reference the hierarchical one is tested against. The expert dispatcher
// (moe/parallel/expert_dispatcher.h) and the communication scheduler run exchanges through this.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "moe/comm/communicator.h"
#include "moe/comm/hierarchical_a2a.h"
#include "moe/tensor.h"

namespace moe::comm {

// Which all-to-all-v carries expert-parallel traffic (moe-train --a2a flat|hierarchical).
enum class A2AAlgorithm { flat, hierarchical };
const char* a2a_algorithm_name(A2AAlgorithm algorithm);
// "flat" or "hierarchical"; anything else throws moe::UsageError listing the choices.
A2AAlgorithm parse_a2a_algorithm(std::string_view name);

// Runs the chosen algorithm over one world: flat is world.all_to_all_v, hierarchical a
// HierarchicalAllToAll built at construction (collective), `ranks_per_node`
// as in its constructor.
class AllToAllV {
 public:
  AllToAllV(Communicator& world, A2AAlgorithm algorithm, int ranks_per_node = 0);

  void run(const Tensor& send, std::span<const int64_t> send_counts, Tensor& recv,
           std::span<const int64_t> recv_counts);

  A2AAlgorithm algorithm() const { return algorithm_; }
  // The hierarchical implementation, or nullptr for flat.
  const HierarchicalAllToAll* hierarchical() const { return hierarchical_.get(); }

 private:
  Communicator& world_;
  A2AAlgorithm algorithm_;
  std::unique_ptr<HierarchicalAllToAll> hierarchical_;
};

}  // namespace moe::comm
