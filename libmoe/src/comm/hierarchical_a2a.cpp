// Hierarchical all-to-all-v: node exchange, cross-node exchange among equal local ranks, reorder.
// R = world size, L = ranks per node, N = R / L nodes, (n, l) = local rank l on node n; counts are
// rows. Rows are moved as opaque bytes (memcpy; device-to-device copies when the buffers are on a
// GPU), so the result is bitwise that of the flat call.
#include "moe/comm/hierarchical_a2a.h"

#include <algorithm>
#include <numeric>

namespace moe::comm {

namespace {

constexpr const char* kOp = "hierarchical all_to_all_v";

std::vector<int64_t> gather_i64(Communicator& comm, std::span<const int64_t> mine) {
  const int64_t n = static_cast<int64_t>(mine.size());
  Tensor send = Tensor::empty({n}, DType::i64);
  std::copy(mine.begin(), mine.end(), send.data<int64_t>());
  Tensor all = Tensor::empty({comm.size() * n}, DType::i64);
  comm.all_gather(send, all);
  return std::vector<int64_t>(all.data<int64_t>(), all.data<int64_t>() + all.numel());
}

// Copies `rows` rows of src (from row `from`) to dst (at row `to`); both [rows, width] of one dtype
// on one device (Tensor::copy_from: memcpy on the host, an asynchronous copy on the GPU's stream).
void copy_rows(const Tensor& src, int64_t from, Tensor& dst, int64_t to, int64_t rows) {
  if (rows == 0) return;
  Tensor part = dst.rows(to, to + rows);
  part.copy_from(src.rows(from, from + rows));
}

// Rows -> first row of each block, plus the total at the end.
std::vector<int64_t> prefix(std::span<const int64_t> counts) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) offsets[i + 1] = offsets[i] + counts[i];
  return offsets;
}

int64_t checked_total(std::span<const int64_t> counts, const char* which, const std::string& who) {
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    MOE_CHECK(counts[r] >= 0, kOp, " on ", who, ": ", which, "[", r, "] = ", counts[r],
              " is negative");
    total += counts[r];
  }
  return total;
}

}  // namespace

HierarchicalAllToAll::HierarchicalAllToAll(Communicator& world, int ranks_per_node,
                                           NodeLayout layout)
    : world_(world) {
  const int R = world.size(), me = world.rank();
  MOE_USAGE_CHECK(ranks_per_node >= 0, kOp, " on ", world.describe(), ": ranks_per_node ",
                  ranks_per_node, " is negative (0 takes the nodes from the machine)");
  // Every rank must take the same branch below (each creates sub-communicators collectively), so
  // agree on the request first.
  const int64_t requested[2] = {ranks_per_node,
                                ranks_per_node > 0 && layout == NodeLayout::cyclic ? 1 : 0};
  std::vector<int64_t> everyone = gather_i64(world, requested);
  for (int r = 0; r < R; ++r)
    MOE_USAGE_CHECK(everyone[2 * r] == requested[0] && everyone[2 * r + 1] == requested[1], kOp,
                    " on ", world.describe(), ": rank ", r, " asks for ranks_per_node ",
                    everyone[2 * r], everyone[2 * r + 1] ? " cyclic" : "", " but this rank for ",
                    requested[0], requested[1] ? " cyclic" : "",
                    " (every rank must pass the same values)");

  if (ranks_per_node > 0) {
    MOE_USAGE_CHECK(R % ranks_per_node == 0, kOp, ": world size ", R,
                    " is not divisible by ranks_per_node ", ranks_per_node,
                    " (virtual nodes must all hold ranks_per_node ranks)");
    ranks_per_node_ = ranks_per_node;
    nodes_ = R / ranks_per_node;
    const bool cyclic = layout == NodeLayout::cyclic;
    node_index_ = cyclic ? me % nodes_ : me / ranks_per_node_;
    local_ = cyclic ? me / nodes_ : me % ranks_per_node_;
    world_of_.resize(static_cast<size_t>(R));
    for (int n = 0; n < nodes_; ++n)
      for (int l = 0; l < ranks_per_node_; ++l)
        world_of_[static_cast<size_t>(n) * ranks_per_node_ + l] =
            cyclic ? l * nodes_ + n : n * ranks_per_node_ + l;
  } else {
    // Real nodes. Number them by the world rank of their local rank 0 (the same order on every
    // rank), and check that they all hold the same number of ranks.
    std::unique_ptr<Communicator> node_comm = world.split_node();
    Tensor leader = Tensor::empty({1}, DType::i64);
    leader.data<int64_t>()[0] = me;
    node_comm->broadcast(leader, 0);
    const int64_t info[3] = {node_comm->size(), node_comm->rank(), leader.data<int64_t>()[0]};
    std::vector<int64_t> table = gather_i64(world, info);
    std::vector<int64_t> leaders;
    for (int r = 0; r < R; ++r) leaders.push_back(table[3 * r + 2]);
    std::sort(leaders.begin(), leaders.end());
    leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
    const int64_t L = table[0];
    for (int r = 0; r < R; ++r)
      MOE_USAGE_CHECK(table[3 * r] == L, kOp, " on ", world.describe(), ": world rank 0 has ", L,
                      " ranks on its node but world rank ", r, " has ", table[3 * r],
                      " (nodes must hold the same number of ranks; pass ranks_per_node)");
    ranks_per_node_ = static_cast<int>(L);
    nodes_ = static_cast<int>(leaders.size());
    MOE_CHECK(static_cast<int64_t>(nodes_) * L == R, kOp, ": ", nodes_, " nodes of ", L,
              " ranks do not make a world of ", R);
    world_of_.assign(static_cast<size_t>(R), -1);
    for (int r = 0; r < R; ++r) {
      int64_t n =
          std::lower_bound(leaders.begin(), leaders.end(), table[3 * r + 2]) - leaders.begin();
      int64_t slot = n * L + table[3 * r + 1];
      MOE_CHECK(world_of_[static_cast<size_t>(slot)] == -1, kOp, ": world ranks ",
                world_of_[static_cast<size_t>(slot)], " and ", r, " both claim local rank ",
                table[3 * r + 1], " of node ", n);
      world_of_[static_cast<size_t>(slot)] = r;
      if (r == me) {
        node_index_ = static_cast<int>(n);
        local_ = static_cast<int>(table[3 * r + 1]);
      }
    }
    if (!degenerate()) node_comm_ = std::move(node_comm);
  }
  for (int i = 0; i < R; ++i) block_placement_ = block_placement_ && world_of_[i] == i;
  if (degenerate()) return;

  // split() orders each group by (key, world rank): node members by world rank, which is local
  // rank order in every layout above; cross-node groups by node index.
  if (!node_comm_) node_comm_ = world.split(node_index_, me);
  cross_comm_ = world.split(local_, node_index_);
  MOE_CHECK(node_comm_->size() == ranks_per_node_ && node_comm_->rank() == local_ &&
                cross_comm_->size() == nodes_ && cross_comm_->rank() == node_index_,
            kOp, " on ", world.describe(), ": sub-communicators came out as node ",
            node_comm_->describe(), " and cross ", cross_comm_->describe(),
            ", expected local rank ", local_, " of ", ranks_per_node_, " and node ", node_index_,
            " of ", nodes_);
}

HierarchicalAllToAll::~HierarchicalAllToAll() = default;

void HierarchicalAllToAll::check_arguments(const Tensor& send, std::span<const int64_t> send_counts,
                                           const Tensor& recv,
                                           std::span<const int64_t> recv_counts) const {
  const std::string who = world_.describe();
  MOE_CHECK(send.defined() && recv.defined(), kOp, " on ", who, ": send ", send.describe(),
            " or recv ", recv.describe(), " is undefined");
  MOE_CHECK(send.dtype() == recv.dtype(), kOp, " on ", who, ": send ", send.describe(),
            " and recv ", recv.describe(), " differ in dtype");
  const int64_t R = world_.size();
  MOE_CHECK(static_cast<int64_t>(send_counts.size()) == R &&
                static_cast<int64_t>(recv_counts.size()) == R,
            kOp, " on ", who, ": ", send_counts.size(), " send counts and ", recv_counts.size(),
            " recv counts for ", R, " ranks");
  MOE_CHECK(row_elements(send) == row_elements(recv), kOp, " on ", who, ": rows of send ",
            send.describe(), " and recv ", recv.describe(), " differ in width");
  const int64_t sent = checked_total(send_counts, "send_counts", who);
  MOE_CHECK(sent == send.dim(0), kOp, " on ", who, ": send counts sum to ", sent,
            " rows but send is ", send.describe());
  const int64_t received = checked_total(recv_counts, "recv_counts", who);
  MOE_CHECK(received == recv.dim(0), kOp, " on ", who, ": recv counts sum to ", received,
            " rows but recv is ", recv.describe());
}

void HierarchicalAllToAll::all_to_all_v(const Tensor& send, std::span<const int64_t> send_counts,
                                        Tensor& recv, std::span<const int64_t> recv_counts) {
  check_arguments(send, send_counts, recv, recv_counts);
  if (degenerate()) {
    world_.all_to_all_v(send, send_counts, recv, recv_counts);
    return;
  }
  const int L = ranks_per_node_, N = nodes_;
  const int64_t width = row_elements(send);
  const DType dtype = send.dtype();
  const Device device = send.device();
  const Tensor rows_in = send.reshape({send.dim(0), width});
  Tensor rows_out = recv.reshape({recv.dim(0), width});
  workspace_.reset();
  ArenaScope scope(workspace_);

  // Counts first, in flight while the send rows are packed: mine[l'][m] = rows for (m, l'), and
  // from each local peer l', theirs[l'][m] = rows (n, l') holds for (m, this local rank).
  Tensor mine = Tensor::empty({static_cast<int64_t>(L) * N}, DType::i64);
  Tensor theirs = Tensor::empty({static_cast<int64_t>(L) * N}, DType::i64);
  for (int lp = 0; lp < L; ++lp)
    for (int m = 0; m < N; ++m) mine.data<int64_t>()[lp * N + m] = send_counts[world_rank(m, lp)];
  const std::vector<int64_t> n_each(static_cast<size_t>(L), N);
  Request counts = node_comm_->iall_to_all_v(mine, n_each, theirs, n_each);

  // Pack 1: send rows grouped by destination local rank, then node ([l'][m]).
  const std::vector<int64_t> send_offset = prefix(send_counts);
  Tensor packed = Tensor::empty({send.dim(0), width}, dtype, device);
  std::vector<int64_t> phase1_send(static_cast<size_t>(L), 0);
  int64_t packed_rows = 0;
  for (int lp = 0; lp < L; ++lp) {
    for (int m = 0; m < N; ++m) {
      const int d = world_rank(m, lp);
      copy_rows(rows_in, send_offset[d], packed, packed_rows, send_counts[d]);
      packed_rows += send_counts[d];
      phase1_send[lp] += send_counts[d];
    }
  }
  counts.wait();
  const int64_t* block = theirs.data<int64_t>();  // [l'][m]
  std::vector<int64_t> phase1_recv(static_cast<size_t>(L), 0);
  std::vector<int64_t> phase2_send(static_cast<size_t>(N), 0);
  for (int lp = 0; lp < L; ++lp)
    for (int m = 0; m < N; ++m) {
      MOE_CHECK(block[lp * N + m] >= 0, kOp, " on ", world_.describe(), ": local rank ", lp,
                " reports ", block[lp * N + m], " rows for node ", m);
      phase1_recv[lp] += block[lp * N + m];
      phase2_send[m] += block[lp * N + m];
    }
  const int64_t gathered = std::accumulate(phase1_recv.begin(), phase1_recv.end(), int64_t{0});

  // Phase 1: within the node.
  Tensor on_node = Tensor::empty({gathered, width}, dtype, device);
  node_comm_->all_to_all_v(packed, phase1_send, on_node, phase1_recv);

  // Pack 2: [l'][m] -> [m][l'], so that each node's rows are contiguous.
  Tensor regrouped = Tensor::empty({gathered, width}, dtype, device);
  {
    const std::vector<int64_t> offset = prefix(std::span<const int64_t>(block, L * N));
    int64_t at = 0;
    for (int m = 0; m < N; ++m) {
      for (int lp = 0; lp < L; ++lp) {
        copy_rows(on_node, offset[lp * N + m], regrouped, at, block[lp * N + m]);
        at += block[lp * N + m];
      }
    }
  }

  // Phase 2: across nodes; from node m arrive the rows of (m, 0), ..., (m, L-1) in that order.
  std::vector<int64_t> phase2_recv(static_cast<size_t>(N), 0);
  for (int m = 0; m < N; ++m)
    for (int lp = 0; lp < L; ++lp) phase2_recv[m] += recv_counts[world_rank(m, lp)];
  if (block_placement_) {  // (m, l') is world rank m * L + l': already source order
    cross_comm_->all_to_all_v(regrouped, phase2_send, recv, phase2_recv);
    return;
  }
  Tensor arrived = Tensor::empty({recv.dim(0), width}, dtype, device);
  cross_comm_->all_to_all_v(regrouped, phase2_send, arrived, phase2_recv);
  const std::vector<int64_t> recv_offset = prefix(recv_counts);
  int64_t at = 0;
  for (int m = 0; m < N; ++m) {
    for (int lp = 0; lp < L; ++lp) {
      const int s = world_rank(m, lp);
      copy_rows(arrived, at, rows_out, recv_offset[s], recv_counts[s]);
      at += recv_counts[s];
    }
  }
}

}  // namespace moe::comm
