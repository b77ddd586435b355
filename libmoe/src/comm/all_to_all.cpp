// The all-to-all-v by algorithm (see moe/comm/all_to_all.h).
#include "moe/comm/all_to_all.h"

namespace moe::comm {

const char* a2a_algorithm_name(A2AAlgorithm algorithm) {
  switch (algorithm) {
    case A2AAlgorithm::flat:
      return "flat";
    case A2AAlgorithm::hierarchical:
      return "hierarchical";
  }
  return "?";
}

A2AAlgorithm parse_a2a_algorithm(std::string_view name) {
  if (name == "flat") return A2AAlgorithm::flat;
  if (name == "hierarchical") return A2AAlgorithm::hierarchical;
  throw UsageError(str("unknown all-to-all algorithm '", name, "' (choices: flat, hierarchical)"));
}

AllToAllV::AllToAllV(Communicator& world, A2AAlgorithm algorithm, int ranks_per_node)
    : world_(world), algorithm_(algorithm) {
  if (algorithm == A2AAlgorithm::hierarchical)
    hierarchical_ = std::make_unique<HierarchicalAllToAll>(world, ranks_per_node);
}

void AllToAllV::run(const Tensor& send, std::span<const int64_t> send_counts, Tensor& recv,
                    std::span<const int64_t> recv_counts) {
  if (hierarchical_)
    hierarchical_->all_to_all_v(send, send_counts, recv, recv_counts);
  else
    world_.all_to_all_v(send, send_counts, recv, recv_counts);
}

}  // namespace moe::comm
