// Backend-independent parts of the Communicator: requests, blocking wrappers, argument checks
// (R = size() peers, counts in rows of the leading dimension) and the start-up consistency check.
#include "moe/comm/communicator.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <numeric>
#include <string_view>

#include "moe/log.h"

namespace moe::comm {

namespace {
std::atomic<WaitMode> g_wait_mode{WaitMode::spin};
}

void set_wait_mode(WaitMode mode) { g_wait_mode.store(mode); }
WaitMode wait_mode() { return g_wait_mode.load(); }
const char* wait_mode_name(WaitMode mode) { return mode == WaitMode::spin ? "spin" : "sleep"; }

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

int64_t row_elements(const Tensor& t) {
  MOE_CHECK(t.ndim() >= 1, "communicator: ", t.describe(),
            " has no leading dimension to count rows in");
  int64_t n = 1;
  for (int i = 1; i < t.ndim(); ++i) n *= t.shape()[i];
  return n;
}

// ---- Request -------------------------------------------------------------------------------

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    finish_quietly();
    op_ = std::move(other.op_);
  }
  return *this;
}

Request::~Request() { finish_quietly(); }

void Request::finish_quietly() noexcept {
  if (!op_) return;
  try {
    op_->wait();
  } catch (const std::exception& e) {
    MOE_LOG_ERROR("communicator: request dropped without wait() failed: ", e.what());
  }
  op_.reset();
}

void Request::wait() {
  if (!op_) return;
  // Released before waiting: a failed operation is not waited for a second time by ~Request.
  std::unique_ptr<PendingOp> op = std::move(op_);
  op->wait();
}

bool Request::test() {
  if (!op_) return true;
  if (!op_->test()) return false;
  std::unique_ptr<PendingOp> op = std::move(op_);
  op->wait();  // already complete: returns at once, or throws the operation's error
  return true;
}

void wait_all(std::span<Request> requests) {
  std::exception_ptr first;
  for (Request& r : requests) {
    try {
      r.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

// ---- blocking wrappers -----------------------------------------------------------------------

void Communicator::all_reduce(Tensor& buf, ReduceOp op) { iall_reduce(buf, op).wait(); }
void Communicator::all_gather(const Tensor& send, Tensor& recv) { iall_gather(send, recv).wait(); }
void Communicator::all_gatherv(const Tensor& send, Tensor& recv,
                               std::span<const int64_t> recv_counts) {
  iall_gatherv(send, recv, recv_counts).wait();
}
void Communicator::all_to_all_v(const Tensor& send, std::span<const int64_t> send_counts,
                                Tensor& recv, std::span<const int64_t> recv_counts) {
  iall_to_all_v(send, send_counts, recv, recv_counts).wait();
}
void Communicator::broadcast(Tensor& buf, int root) { ibroadcast(buf, root).wait(); }
void Communicator::reduce_scatterv(const Tensor& send, Tensor& recv,
                                   std::span<const int64_t> recv_counts, ReduceOp op) {
  ireduce_scatterv(send, recv, recv_counts, op).wait();
}

Request Communicator::ireduce_scatterv(const Tensor& send, Tensor& recv,
                                       std::span<const int64_t> recv_counts, ReduceOp op) {
  check_reduce_scatterv(send, recv, recv_counts, op);
  throw Error(str("reduce_scatterv on ", describe(), ": the ", name(),
                  " communicator has no reduce-scatter"));
}
void Communicator::send(const Tensor& buf, int peer, int tag) { isend(buf, peer, tag).wait(); }
void Communicator::recv(Tensor& buf, int peer, int tag) { irecv(buf, peer, tag).wait(); }

std::string Communicator::describe() const { return str(name(), " rank ", rank(), "/", size()); }

// ---- argument checks -------------------------------------------------------------------------

void Communicator::check_buffer(const char* op, const Tensor& t) const {
  MOE_CHECK(t.defined(), op, " on ", describe(), ": buffer ", t.describe(), " is undefined");
}

void Communicator::check_reducible(const char* op, const Tensor& t, ReduceOp reduce) const {
  check_buffer(op, t);
  DType d = t.dtype();
  MOE_CHECK(d == DType::f32 || d == DType::i32 || d == DType::i64, op, " (", reduce_op_name(reduce),
            ") on ", describe(), ": ", t.describe(),
            ": only f32, i32 and i64 buffers are reduced (convert 16-bit floats to f32 first)");
}

void Communicator::check_peer(const char* op, int peer) const {
  MOE_CHECK(peer >= 0 && peer < size(), op, " on ", describe(), ": rank ", peer,
            " is outside the communicator (size ", size(), ")");
}

namespace {

int64_t checked_sum(const char* op, const char* which, std::span<const int64_t> counts,
                    const std::string& where) {
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    MOE_CHECK(counts[r] >= 0, op, " on ", where, ": ", which, "[", r, "] = ", counts[r],
              " is negative");
    total += counts[r];
  }
  return total;
}

}  // namespace

void Communicator::check_all_gather(const Tensor& send, const Tensor& recv) const {
  const char* op = "all_gather";
  check_buffer(op, send);
  check_buffer(op, recv);
  MOE_CHECK(send.dtype() == recv.dtype(), op, " on ", describe(), ": send ", send.describe(),
            " and recv ", recv.describe(), " differ in dtype");
  MOE_CHECK(recv.numel() == send.numel() * size(), op, " on ", describe(), ": recv ",
            recv.describe(), " must hold ", size(), " x ", send.numel(), " elements of send ",
            send.describe());
}

// all_gatherv and reduce_scatterv mirror each other: this rank's `part` (counts[rank()] rows) and
// every rank's rows, rank-major, in `whole` (the counts' sum); all_gatherv sends the part,
// reduce_scatterv receives it.
void Communicator::check_parts(const char* op, const Tensor& send, const Tensor& recv,
                               std::span<const int64_t> recv_counts, bool part_is_send) const {
  check_buffer(op, send);
  check_buffer(op, recv);
  MOE_CHECK(send.dtype() == recv.dtype(), op, " on ", describe(), ": send ", send.describe(),
            " and recv ", recv.describe(), " differ in dtype");
  MOE_CHECK(static_cast<int64_t>(recv_counts.size()) == size(), op, " on ", describe(), ": ",
            recv_counts.size(), " recv counts for ", size(), " ranks");
  MOE_CHECK(row_elements(send) == row_elements(recv), op, " on ", describe(), ": rows of send ",
            send.describe(), " and recv ", recv.describe(), " differ in width");
  const Tensor& part = part_is_send ? send : recv;
  const Tensor& whole = part_is_send ? recv : send;
  MOE_CHECK(recv_counts[rank()] == part.dim(0), op, " on ", describe(), ": recv_counts[", rank(),
            "] = ", recv_counts[rank()], part_is_send ? " but this rank sends " : " but recv is ",
            part.describe());
  int64_t total = checked_sum(op, "recv_counts", recv_counts, describe());
  MOE_CHECK(total == whole.dim(0), op, " on ", describe(), ": recv counts sum to ", total,
            " rows but ", part_is_send ? "recv" : "send", " is ", whole.describe());
}

void Communicator::check_all_gatherv(const Tensor& send, const Tensor& recv,
                                     std::span<const int64_t> recv_counts) const {
  check_parts("all_gatherv", send, recv, recv_counts, true);
}

void Communicator::check_reduce_scatterv(const Tensor& send, const Tensor& recv,
                                         std::span<const int64_t> recv_counts,
                                         ReduceOp reduce) const {
  check_reducible("reduce_scatterv", send, reduce);
  check_parts("reduce_scatterv", send, recv, recv_counts, false);
}

void Communicator::check_all_to_all_v(const Tensor& send, std::span<const int64_t> send_counts,
                                      const Tensor& recv,
                                      std::span<const int64_t> recv_counts) const {
  const char* op = "all_to_all_v";
  check_buffer(op, send);
  check_buffer(op, recv);
  MOE_CHECK(send.dtype() == recv.dtype(), op, " on ", describe(), ": send ", send.describe(),
            " and recv ", recv.describe(), " differ in dtype");
  MOE_CHECK(static_cast<int64_t>(send_counts.size()) == size() &&
                static_cast<int64_t>(recv_counts.size()) == size(),
            op, " on ", describe(), ": ", send_counts.size(), " send counts and ",
            recv_counts.size(), " recv counts for ", size(), " ranks");
  MOE_CHECK(row_elements(send) == row_elements(recv), op, " on ", describe(), ": rows of send ",
            send.describe(), " and recv ", recv.describe(), " differ in width");
  int64_t sent = checked_sum(op, "send_counts", send_counts, describe());
  MOE_CHECK(sent == send.dim(0), op, " on ", describe(), ": send counts sum to ", sent,
            " rows but send is ", send.describe());
  int64_t received = checked_sum(op, "recv_counts", recv_counts, describe());
  MOE_CHECK(received == recv.dim(0), op, " on ", describe(), ": recv counts sum to ", received,
            " rows but recv is ", recv.describe());
}

// ---- check_same_everywhere -------------------------------------------------------------------

namespace {

// Up to 40 bytes of `s` from `pos`, quoted, for an error message.
std::string excerpt(const std::string& s, size_t pos) {
  if (pos >= s.size()) return "<end>";
  size_t n = std::min<size_t>(40, s.size() - pos);
  return str('\'', std::string_view(s).substr(pos, n), '\'', pos + n < s.size() ? "..." : "");
}

}  // namespace

void Communicator::check_same_everywhere(const std::string& what, const std::string& value) {
  // Gather every rank's value on every rank, so that all of them reach the same verdict and throw
  // the same message (no rank is left waiting in a later collective).
  Tensor length = Tensor::empty({1}, DType::i64);
  length.data<int64_t>()[0] = static_cast<int64_t>(value.size());
  Tensor lengths = Tensor::empty({size()}, DType::i64);
  all_gather(length, lengths);
  std::vector<int64_t> counts(lengths.data<int64_t>(), lengths.data<int64_t>() + size());

  Tensor mine = Tensor::empty({static_cast<int64_t>(value.size())}, DType::u8);
  std::memcpy(mine.raw(), value.data(), value.size());
  Tensor all =
      Tensor::empty({std::accumulate(counts.begin(), counts.end(), int64_t{0})}, DType::u8);
  all_gatherv(mine, all, counts);

  const char* bytes = static_cast<const char*>(all.raw());
  std::string first(bytes, static_cast<size_t>(counts[0]));
  int64_t offset = counts[0];
  for (int r = 1; r < size(); ++r) {
    std::string other(bytes + offset, static_cast<size_t>(counts[r]));
    offset += counts[r];
    if (other == first) continue;
    auto diff = std::mismatch(first.begin(), first.end(), other.begin(), other.end());
    size_t pos = static_cast<size_t>(diff.first - first.begin());
    throw Error(str(what, " differs between ranks: rank ", r, " disagrees with rank 0 at byte ",
                    pos, " (rank 0: ", excerpt(first, pos), ", rank ", r, ": ", excerpt(other, pos),
                    "; lengths ", first.size(), " and ", other.size(), "; ", name(),
                    " communicator of ", size(), " ranks)"));
  }
}

// ---- factories -------------------------------------------------------------------------------

std::unique_ptr<Communicator> make_world() {
#ifdef MOE_HAVE_MPI
  if (launched_under_mpi()) return make_mpi_world();
#endif
  return make_local();
}

}  // namespace moe::comm
