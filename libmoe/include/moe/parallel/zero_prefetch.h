// ZeroPrefetch: --zero 3's all-gathers run ahead of compute (MoESys's "horizontal" prefetch,
// --zero-prefetch N). A training pass gathers its groups in a fixed order, the same on every
// rank: -1 (embeddings, final norm, head; held for the whole pass), the blocks 0..L-1 for the
// forward, then L-1..0 for the backward (recomputation or not, a block is gathered again for its
// backward). While compute uses entry k of that order, a thread of ours all-gathers entries
// k+1..k+N over its own duplicate of the group's communicator; gather() then only waits for the
// buffers and installs them (DenseShards::install). The collectives are DenseShards::gather's,
// in the same order on every rank, only earlier and on another communicator: the values are the
// same bits (an all-gather copies, it adds nothing).
//
// Memory: a block is released (forward: after its forward; backward: after its backward) before
// the entry N past the next one is started, so at most N + 1 blocks' values exist at once (the
// one computing and N ahead), plus group -1; N = 0 is the synchronous path (one block).
//
// Threads: the prefetch thread calls MPI on its communicator while the caller's thread calls it
// on others (the expert all-to-all, the reduce-scatter of a backward's release): that needs
// MPI_THREAD_MULTIPLE, which comm::make_mpi_world asks for and MPICH grants (where MPI grants
// less, ZeroPrefetch warns and gathers synchronously, as N = 0); NCCL would give the duplicate a
// stream of its own. Errors of a prefetched all-gather are rethrown by the gather() that wanted
// its group. A pass that ends early (an exception on this rank) leaves prefetches in flight: the
// next begin_pass() waits for them (the peers run them too) and discards their buffers;
// destroying this object during stack unwinding detaches the thread instead of joining it (its
// job owns what it touches), so a rank that fails alone never hangs in a join: the tool's abort
// ends it.
#pragma once
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/parallel/zero.h"

namespace moe::parallel {

// The seconds of one step (or since the last take_stats()).
struct PrefetchStats {
  double wait_seconds = 0;    // compute blocked in gather() for a group's values
  double gather_seconds = 0;  // the all-gathers themselves (on the prefetch thread when N > 0)
  int64_t gathers = 0;        // groups all-gathered
  int64_t out_of_order = 0;   // gather() calls the pass's order did not foresee (synchronous)
};

class ZeroPrefetch {
 public:
  // Collective over `group` (the shards' communicator) when depth > 0: it takes a duplicate.
  // `shards` (stage 3) and `group` must outlive this object.
  ZeroPrefetch(DenseShards& shards, comm::Communicator& group, int64_t depth);
  ~ZeroPrefetch();
  ZeroPrefetch(const ZeroPrefetch&) = delete;
  ZeroPrefetch& operator=(const ZeroPrefetch&) = delete;

  // The gathers of a training pass of `blocks` blocks, in the order Transformer::forward_backward
  // makes them: -1, 0..L-1, L-1..0; of an evaluation (its BlockHooks; group -1 gathered by the
  // caller around it): 0..L-1.
  static std::vector<int64_t> pass_order(int64_t blocks, bool training = true);
  // A pass of `blocks` blocks starts; the first N + 1 entries of its order are started now.
  void begin_pass(int64_t blocks, bool training = true);
  // ParamHooks of the pass: gather waits for (or runs) group g's all-gather and installs it;
  // release is DenseShards::release. A call out of the expected order falls back to the
  // synchronous gather (prefetches already started are waited for and dropped).
  void gather(int64_t g, bool backward);
  void release(int64_t g, bool reduce_grads);

  int64_t depth() const { return depth_; }
  // Entries of the order started and not yet installed (at most N + 1, right after begin_pass).
  int64_t ahead() const { return static_cast<int64_t>(submitted_ - next_); }
  PrefetchStats take_stats();

  struct Shared;  // the thread's state (zero_prefetch.cpp)

 private:
  void submit_through(size_t k);  // start every entry of the order up to k
  void drain();                   // wait for and drop every prefetch in flight

  DenseShards& shards_;
  int64_t depth_;
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
  std::vector<int64_t> order_;  // this pass's gathers, in order
  size_t next_ = 0;             // the entry the next gather() expects
  size_t submitted_ = 0;        // entries [next_, submitted_) are in flight or done
  PrefetchStats stats_;         // the caller's side (waits; the synchronous gathers)
};

}  // namespace moe::parallel
