// Communicator: the device-neutral seam for collectives between ranks (MPI today, NCCL later,
// "local" for the launcher-free single process). Buffers are contiguous moe::Tensors; counts of
// the v-collectives are in rows of the leading dimension (R = size() peers, one count per peer),
// a row being numel / dim(0) elements (the product of the trailing dimensions).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moe/tensor.h"

namespace moe::comm {

enum class ReduceOp { sum, max, min };
const char* reduce_op_name(ReduceOp op);

// What a backend keeps alive while an operation is in flight (its request handle, the buffers,
// the count arrays MPI reads until completion).
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  virtual void wait() = 0;  // throws moe::Error when the operation failed
  virtual bool test() = 0;  // true once complete (then wait() returns at once)
};

// A waitable handle on a non-blocking operation. Movable, not copyable. The destructor waits, so an
// in-flight operation never outlives its handle (errors seen there are logged, not thrown).
class Request {
 public:
  Request() = default;  // an already-completed request
  explicit Request(std::unique_ptr<PendingOp> op) : op_(std::move(op)) {}
  Request(Request&& other) noexcept = default;
  Request& operator=(Request&& other) noexcept;  // finishes the operation it held first
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  void wait();
  bool test();
  bool done() const { return op_ == nullptr; }

 private:
  void finish_quietly() noexcept;
  std::unique_ptr<PendingOp> op_;
};

// Waits for all of them (in order); rethrows the first error after waiting for the others.
void wait_all(std::span<Request> requests);

// How a backend waits for an operation to complete. MPI progresses only inside MPI calls:
// - spin: poll without pause (MPI_Wait). Fastest when every rank has a core of its own; the
//   shared-memory pipeline of a large message advances at every poll.
// - sleep: poll for 50 us, then with sleeps growing to 100 us. A rank waiting for a late partner
//   gives its core away instead of holding it; where ranks share cores the partner is often the
//   one that needs it. Large shared-memory messages then move slower (2-4x at 1-64 MiB with 2
//   ranks on 2 cores), so this is for oversubscribed nodes only.
// make_mpi_world() picks sleep when the node holds more ranks than this process may use cores,
// spin otherwise; MOE_MPI_WAIT=spin|sleep overrides. Process-wide.
enum class WaitMode { spin, sleep };
void set_wait_mode(WaitMode mode);
WaitMode wait_mode();
const char* wait_mode_name(WaitMode mode);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "local", "mpi"

  // Collective over this communicator, like MPI_Comm_split: ranks passing the same color form a
  // group ordered by (key, rank). A negative color joins no group and gets nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // The ranks that share memory with this one (one node); collective.
  virtual std::unique_ptr<Communicator> split_node() = 0;
  // split() for traffic that should go first: where a backend queues work on streams (NCCL), the
  // new communicator's operations (and those of its own splits) run on a stream of `priority`
  // (negative = higher; the device clamps it), so the expert all-to-all overtakes gradient
  // all-reduces sharing the GPU (Lina). Backends without streams ignore it.
  virtual std::unique_ptr<Communicator> split_with_priority(int color, int key, int priority) {
    (void)priority;
    return split(color, key);
  }

  // Non-blocking collectives. Buffers must stay alive until the request completes (the request
  // holds a reference to the tensors' storage, which covers owning tensors; arena tensors must
  // not be recycled before). Dtypes: f32, i32, i64, u8, and bf16/f16 as raw 16-bit words for the
  // non-reducing operations.
  virtual Request iall_reduce(Tensor& buf, ReduceOp op) = 0;  // in place; f32, i32, i64
  // recv holds size() * send.numel() elements, rank-major.
  virtual Request iall_gather(const Tensor& send, Tensor& recv) = 0;
  // recv_counts[r] rows come from rank r (recv_counts[rank()] == send.dim(0)), packed rank-major.
  virtual Request iall_gatherv(const Tensor& send, Tensor& recv,
                               std::span<const int64_t> recv_counts) = 0;
  // send_counts[r] rows of send (consecutive, rank-major) go to rank r; recv_counts[r] rows arrive
  // from rank r. Zero counts allowed; send and recv rows must have the same width. Every rank's
  // send_counts[r] must equal rank r's recv_counts[rank()] (not verified: it would cost a message).
  virtual Request iall_to_all_v(const Tensor& send, std::span<const int64_t> send_counts,
                                Tensor& recv, std::span<const int64_t> recv_counts) = 0;
  virtual Request ibroadcast(Tensor& buf, int root) = 0;
  // Reduce-scatter with variable counts: send holds sum(recv_counts) rows, rank-major (rows for
  // rank 0 first); rank r receives into recv (recv_counts[r] rows) the `op` over every rank's rows
  // for r. f32, i32, i64. Backends that have none throw (the base class's default).
  virtual Request ireduce_scatterv(const Tensor& send, Tensor& recv,
                                   std::span<const int64_t> recv_counts, ReduceOp op);
  // Point to point; the received message must fill buf exactly (a size mismatch throws).
  virtual Request isend(const Tensor& buf, int peer, int tag) = 0;
  virtual Request irecv(Tensor& buf, int peer, int tag) = 0;
  virtual void barrier() = 0;

  // Blocking forms: start the non-blocking operation and wait.
  void all_reduce(Tensor& buf, ReduceOp op);
  void all_gather(const Tensor& send, Tensor& recv);
  void all_gatherv(const Tensor& send, Tensor& recv, std::span<const int64_t> recv_counts);
  void all_to_all_v(const Tensor& send, std::span<const int64_t> send_counts, Tensor& recv,
                    std::span<const int64_t> recv_counts);
  void broadcast(Tensor& buf, int root);
  void reduce_scatterv(const Tensor& send, Tensor& recv, std::span<const int64_t> recv_counts,
                       ReduceOp op);
  void send(const Tensor& buf, int peer, int tag);
  void recv(Tensor& buf, int peer, int tag);

  // Start-up consistency check (collective): every rank passes its own `value` (e.g. its config
  // as JSON). When they differ, every rank throws moe::Error naming `what`, the first rank whose
  // value differs from rank 0's, and the first differing position with both sides' text there.
  void check_same_everywhere(const std::string& what, const std::string& value);

  // "mpi rank 2/4" for messages.
  std::string describe() const;

 protected:
  // Shared argument checks for backends; each throws moe::Error naming the operation, the
  // tensor (Tensor::describe) and this communicator.
  void check_buffer(const char* op, const Tensor& t) const;
  void check_reducible(const char* op, const Tensor& t, ReduceOp reduce) const;
  void check_peer(const char* op, int peer) const;
  void check_all_gather(const Tensor& send, const Tensor& recv) const;
  void check_all_gatherv(const Tensor& send, const Tensor& recv,
                         std::span<const int64_t> recv_counts) const;
  void check_all_to_all_v(const Tensor& send, std::span<const int64_t> send_counts,
                          const Tensor& recv, std::span<const int64_t> recv_counts) const;
  void check_reduce_scatterv(const Tensor& send, const Tensor& recv,
                             std::span<const int64_t> recv_counts, ReduceOp op) const;

 private:
  void check_parts(const char* op, const Tensor& send, const Tensor& recv,
                   std::span<const int64_t> recv_counts, bool part_is_send) const;
};

// Elements per row of the leading dimension (1 for a 1-D tensor; a 0-d tensor has no rows).
int64_t row_elements(const Tensor& t);

// The launcher-free default: one rank, every collective a copy or a no-op.
std::unique_ptr<Communicator> make_local();
// MPI's world when the process was started by an MPI launcher (and this build has MPI), else local.
std::unique_ptr<Communicator> make_world();

}  // namespace moe::comm

#ifdef MOE_HAVE_MPI
#include "moe/comm/mpi.h"
#endif
