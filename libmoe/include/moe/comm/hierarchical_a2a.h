// Hierarchical all-to-all-v (MoESys Fig. 8, DeepSpeed-MoE, Tutel 2DH): the same exchange as
// Communicator::all_to_all_v, done in two phases so that each rank talks to L - 1 peers on its node
// and N - 1 peers across nodes instead of to all R - 1 ranks, with larger messages between nodes.
//
// Shape letters: R = world size, L = ranks per node, N = R / L nodes; rank (n, l) is local rank l
// on node n. Counts are rows of the leading dimension, as in Communicator.
//
//   phase 1 (node communicator, L ranks): rank (n, l) sends to local peer l' every row destined to
//            a rank with local rank l' on any node, node by node ([l'][m] order);
//   phase 2 (cross communicator of the ranks with local rank l, N ranks): the rows gathered for
//            (m, l) from all local sources are regrouped [m][l'] and sent to node m;
//   then the rows arrive [m][l'], which is world-rank order when nodes are consecutive ranks
//   (block placement, virtual or real); otherwise they are scattered into source-rank order.
//
// Phase 1 needs, per local peer l', how many rows it holds for (m, l): one all-to-all of N int64
// counts per local peer on the node communicator (R int64 sent and received per rank, one extra
// intra-node latency per call). Phase 2's receive counts follow from recv_counts, with no message.
// The caller's counts must be consistent across ranks exactly as for the flat operation (not
// verified). Local copies: the send rows are packed once before phase 1, the phase-1 result once
// before phase 2, and (non-block placement only) the result once more; workspace is kept between
// calls and grows to the largest exchange seen.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "moe/arena.h"
#include "moe/comm/communicator.h"
#include "moe/tensor.h"

namespace moe::comm {

// How virtual nodes take their ranks: block = ranks [n L, (n + 1) L) (mpiexec's and Slurm's default
// placement), cyclic = ranks n, n + N, n + 2N, ... (Slurm --distribution=cyclic).
enum class NodeLayout { block, cyclic };

class HierarchicalAllToAll {
 public:
  // Collective over `world`, which must outlive this object. ranks_per_node > 0 declares virtual
  // nodes of that many ranks, placed by `layout` (world size must be divisible by it); 0 takes the
  // nodes from world.split_node() (every node must hold the same number of ranks; `layout` is
  // ignored). Every rank must pass the same values (checked: one all_gather at construction).
  // With one node or one rank per node the operation degenerates to world.all_to_all_v, with no
  // sub-communicator created.
  HierarchicalAllToAll(Communicator& world, int ranks_per_node,
                       NodeLayout layout = NodeLayout::block);
  ~HierarchicalAllToAll();
  HierarchicalAllToAll(const HierarchicalAllToAll&) = delete;
  HierarchicalAllToAll& operator=(const HierarchicalAllToAll&) = delete;

  // Same arguments, checks and result (bitwise) as Communicator::all_to_all_v; blocking and
  // collective over the world. Not reentrant: one call at a time per object.
  void all_to_all_v(const Tensor& send, std::span<const int64_t> send_counts, Tensor& recv,
                    std::span<const int64_t> recv_counts);

  int nodes() const { return nodes_; }
  int ranks_per_node() const { return ranks_per_node_; }
  int node() const { return node_index_; }   // n of this rank
  int local_rank() const { return local_; }  // l of this rank
  // True when the two phases are skipped (one node, or one rank per node).
  bool degenerate() const { return nodes_ == 1 || ranks_per_node_ == 1; }
  Communicator& world() const { return world_; }

 private:
  // World rank of local rank `local` on node `node`.
  int world_rank(int node, int local) const {
    return world_of_[static_cast<size_t>(node) * ranks_per_node_ + local];
  }
  void check_arguments(const Tensor& send, std::span<const int64_t> send_counts, const Tensor& recv,
                       std::span<const int64_t> recv_counts) const;

  Communicator& world_;
  int ranks_per_node_ = 1;
  int nodes_ = 1;
  int node_index_ = 0;
  int local_ = 0;
  bool block_placement_ = true;               // world rank == node * L + local for every rank
  std::vector<int> world_of_;                 // [N * L]: world rank of (n, l) at n * L + l
  std::unique_ptr<Communicator> node_comm_;   // the L ranks of this node, ordered by local rank
  std::unique_ptr<Communicator> cross_comm_;  // the N ranks with this local rank, ordered by node
  // The packed buffers of one call; reset at the start of the next (its chunks are reused, so a
  // steady exchange size allocates nothing after the first call).
  Arena workspace_{size_t{1} << 20};
};

}  // namespace moe::comm
