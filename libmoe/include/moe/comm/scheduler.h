// CommScheduler: Lina's (ATC'23) communication scheduler. One communication thread issues the
// collectives that callers submit, from a priority queue: the all-to-all of expert parallelism is
// high priority; gradient allreduce is cut into micro-ops of at most `partition_bytes` that are low
// priority, so an all-to-all waits for at most the one micro-op already in flight instead of a
// whole bucket of gradients. SchedulerMode::off is the baseline: whole tensors, first in first out.
//
// Issue order (the rule every rank must follow, or collectives mismatch and hang):
//   Every submitted piece (a whole all-to-all, or one allreduce micro-op) gets the next sequence
//   number s = 0, 1, 2, ... in submission order; all ranks must submit the same sequence of ops
//   with the same shapes, dtypes and partition_bytes, so the same piece has the same s on all
//   ranks.
//   - off:      pieces are issued in order of s.
//   - priority: before each issue the communication threads agree on L = the minimum over ranks of
//               the number of pieces submitted so far (an 8-byte allreduce-min on the scheduler's
//               own communicator). Among the pieces with s < L not yet issued, the thread issues
//               the first all-to-all by s if there is one, else the first allreduce micro-op by s.
//   The pieces with s < L and the set already issued are the same on every rank, so the choice is
//   too: the order is a function of the submission sequence and of the agreed L, never of one
//   rank's timing. An all-to-all thus jumps every allreduce micro-op not yet started once every
//   rank has submitted it, which costs it nothing: as a collective it could not start earlier. A
//   piece in flight is never preempted.
//   Cost: one extra 8-byte collective per piece in priority mode (stats().agreements and
//   agreement_seconds). About 5 us each with 2 MPI ranks on 2 cores; with ranks oversubscribed
//   every collective costs a scheduler time slice, so there pick partition_bytes large.
//
// Equality with direct calls: the pieces are the same elementwise reductions over the same ranks,
// so results match a whole-tensor allreduce bit for bit as long as the backend combines ranks in
// the same order at every message size (true of MPICH on 2 and 4 ranks, tested; MPI does not
// promise it in general, so compare with a float tolerance on other layouts).
//
// Communicator: the constructor is collective over `comm` (it takes a duplicate with split(0,
// rank)), and the communication thread uses only that duplicate, so the caller may keep using
// `comm` on its own thread for other collectives. That needs MPI_THREAD_MULTIPLE from the MPI
// backend; with MPI_THREAD_SERIALIZED the caller must not call MPI while the scheduler has work.
//
// Preemption::caller (how train::Trainer runs it): the all-to-all does not enter the queue. It runs
// at once on the caller's thread, on its own communicator (the AllToAllV given, or a second
// duplicate of `comm`), while the communication thread starts no new piece: it never waits behind
// queued micro-ops and shares the links with at most the one in flight. The queue then holds only
// allreduce micro-ops, issued first in first out, so no agreement is needed (the order is the
// submission order on every rank). This is the cheaper rule where collectives cost a scheduler
// time slice (ranks sharing cores): the agreement per piece and the hand-over of each all-to-all
// to the communication thread and back made steps 15-25% slower there (docs/PERFORMANCE.md).
//
// Other groups: an allreduce may name a sub-communicator (expert gradients over their data-parallel
// replicas) and an all-to-all an AllToAllV (expert parallelism, flat or hierarchical). The issue
// order above is still agreed over the whole scheduler communicator, and every rank issues its
// pieces in that one order, so the collectives of every group are issued in the same relative
// order by all of its members: no deadlock. Such a group is then driven by the communication
// thread: the caller must not use it concurrently (it may between its wait()s).
//
// Buffers: the scheduler keeps a reference to each tensor's storage until its piece completes.
// The caller must not read or write a buffer between submission and the completion of its ticket
// (and must not recycle arena tensors before then).
//
// Errors: an exception thrown by a piece on the communication thread is stored with its ticket and
// rethrown by wait(ticket) or wait_all(); the thread goes on with the next pieces, as a caller
// issuing them directly would. If the agreement itself fails the scheduler is broken: every queued
// piece fails with that error and later submissions throw.
//
// Destruction drains: the destructor lets the thread issue every piece already submitted (peers
// expect those collectives), then joins it. Failures no caller collected are logged, never thrown.
// Submit from one thread only: the submission order is the program order that ranks share.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/tensor.h"

namespace moe::comm {

class AllToAllV;

enum class SchedulerMode { off, priority };
const char* scheduler_mode_name(SchedulerMode mode);
SchedulerMode parse_scheduler_mode(std::string_view text);  // "off" | "priority"; else UsageError

enum class CommOpKind { all_reduce, all_to_all };

// How priority mode puts an all-to-all first (see above).
enum class Preemption { queued, caller };
const char* comm_op_kind_name(CommOpKind kind);

// One submitted operation (an allreduce covers all of its micro-ops).
struct Ticket {
  uint64_t id = ~uint64_t{0};
};

struct CommOpStats {
  int64_t ops = 0;          // submitted operations
  int64_t pieces = 0;       // issued pieces (allreduce micro-ops; one per all-to-all)
  int64_t bytes = 0;        // payload issued (allreduce buffer; all-to-all send + recv)
  double comm_seconds = 0;  // communication thread inside the communicator
  double wait_seconds = 0;  // callers blocked in wait()/wait_all() on tickets of this kind
};

struct SchedulerStats {
  CommOpStats all_reduce;
  CommOpStats all_to_all;
  int64_t agreements = 0;        // priority mode: allreduce-min rounds fixing the issue order
  double agreement_seconds = 0;  // time they took
};

// One issued piece, in issue order.
struct ExecutedPiece {
  uint64_t ticket = 0;
  uint64_t sequence = 0;  // submission order of the piece (s above)
  CommOpKind kind = CommOpKind::all_reduce;
  int64_t chunk = 0;   // micro-op index within its allreduce (0 for an all-to-all)
  int64_t chunks = 1;  // micro-ops of that allreduce
  bool failed = false;
};

class CommScheduler {
 public:
  // partition_bytes > 0: the largest allreduce micro-op in priority mode (at least one element).
  CommScheduler(Communicator& comm, size_t partition_bytes, SchedulerMode mode,
                Preemption preemption = Preemption::queued);
  ~CommScheduler();
  CommScheduler(const CommScheduler&) = delete;
  CommScheduler& operator=(const CommScheduler&) = delete;

  // In-place allreduce of buf (contiguous; f32, i32 or i64). Priority mode: micro-ops of at most
  // partition_bytes, element-aligned, low priority; off: one operation. `group`: the ranks to
  // reduce over (null: the scheduler's communicator); see "Other groups" above.
  Ticket all_reduce(Tensor& buf, ReduceOp op, Communicator* group = nullptr);
  // Counts in rows of the leading dimension, as Communicator::iall_to_all_v. High priority.
  // `exchange`: run by this AllToAllV (its communicator and algorithm) instead of the scheduler's
  // communicator. Preemption::caller: runs before returning (the ticket is complete; errors are
  // thrown here).
  Ticket all_to_all_v(const Tensor& send, std::vector<int64_t> send_counts, Tensor& recv,
                      std::vector<int64_t> recv_counts, AllToAllV* exchange = nullptr);

  // Blocks until the ticket's operation completed; rethrows its error. A ticket already collected
  // returns at once. Throws when the scheduler is paused and the ticket has not completed (it
  // would never return), or for a ticket this scheduler never issued.
  void wait(Ticket ticket);
  bool done(Ticket ticket) const;  // completed (successfully or not); does not collect errors
  // Waits for every ticket submitted so far; rethrows the failure of the earliest failed ticket
  // (collected); other failed tickets stay for their own wait() or the next wait_all().
  void wait_all();

  // While paused the thread starts no new piece (one in flight completes). For tests and for
  // callers that want a batch to be ordered as a whole. The destructor resumes.
  void pause();
  void resume();

  SchedulerMode mode() const { return mode_; }
  size_t partition_bytes() const { return partition_bytes_; }
  SchedulerStats stats() const;
  std::vector<ExecutedPiece> execution_log() const;
  void reset_stats();  // clears statistics and the execution log

 private:
  struct Piece {
    uint64_t ticket = 0;
    uint64_t sequence = 0;
    CommOpKind kind = CommOpKind::all_reduce;
    int64_t chunk = 0;
    int64_t chunks = 1;
    Tensor buf{};  // allreduce view (storage shared with the caller's tensor), or all-to-all send
    Tensor recv{};
    std::vector<int64_t> send_counts{};
    std::vector<int64_t> recv_counts{};
    ReduceOp op = ReduceOp::sum;
    int64_t bytes = 0;
    Communicator* group = nullptr;  // allreduce over this group instead of comm_
    AllToAllV* exchange = nullptr;  // all-to-all run by this object instead of comm_
  };
  struct TicketState {
    CommOpKind kind;
    int64_t remaining;  // pieces not completed
    std::exception_ptr error;
  };

  Ticket all_to_all_now(const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
                        const std::vector<int64_t>& recv_counts, AllToAllV* exchange);
  void run();  // the communication thread
  bool next_piece(Piece& out, std::unique_lock<std::mutex>& lock);
  void execute(Piece& piece);
  void fail_queued(std::exception_ptr error);
  void check_usable() const;  // mutex held
  void wait_locked(uint64_t id, std::unique_lock<std::mutex>& lock);

  std::unique_ptr<Communicator> comm_;  // the scheduler's duplicate; used by the thread only
  size_t partition_bytes_;
  SchedulerMode mode_;
  Preemption preemption_;
  std::unique_ptr<Communicator> a2a_comm_;  // Preemption::caller: the caller's all-to-alls
  bool preempting_ = false;                 // a caller's all-to-all runs: start no new piece

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;  // thread: work, resume or stop
  std::condition_variable done_cv_;  // callers: a piece completed
  std::deque<Piece> high_, low_;     // each in sequence order
  std::map<uint64_t, TicketState> tickets_;
  uint64_t next_ticket_ = 0;
  uint64_t next_sequence_ = 0;
  bool paused_ = false;
  bool stopping_ = false;
  std::exception_ptr broken_;
  SchedulerStats stats_;
  std::vector<ExecutedPiece> log_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace moe::comm
