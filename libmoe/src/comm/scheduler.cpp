// The communication scheduler: submission (cutting allreduce into micro-ops), the communication
// thread with its issue rule (see scheduler.h: order agreed across ranks in priority mode), and
// tickets. One mutex guards the queues, tickets, statistics and log; the thread never holds it
// while inside the communicator.
#include "moe/comm/scheduler.h"

#include <algorithm>
#include <utility>

#include "moe/comm/all_to_all.h"
#include "moe/log.h"
#include "moe/timer.h"

namespace moe::comm {

const char* scheduler_mode_name(SchedulerMode mode) {
  switch (mode) {
    case SchedulerMode::off:
      return "off";
    case SchedulerMode::priority:
      return "priority";
  }
  return "?";
}

SchedulerMode parse_scheduler_mode(std::string_view text) {
  if (text == "off") return SchedulerMode::off;
  if (text == "priority") return SchedulerMode::priority;
  throw UsageError(str("communication scheduler mode '", text, "': expected off or priority"));
}

const char* comm_op_kind_name(CommOpKind kind) {
  switch (kind) {
    case CommOpKind::all_reduce:
      return "all_reduce";
    case CommOpKind::all_to_all:
      return "all_to_all";
  }
  return "?";
}

namespace {

CommOpStats& stats_of(SchedulerStats& stats, CommOpKind kind) {
  return kind == CommOpKind::all_to_all ? stats.all_to_all : stats.all_reduce;
}

std::string what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

CommScheduler::CommScheduler(Communicator& comm, size_t partition_bytes, SchedulerMode mode,
                             Preemption preemption)
    : partition_bytes_(partition_bytes), mode_(mode), preemption_(preemption) {
  MOE_CHECK(partition_bytes > 0, "comm scheduler on ", comm.describe(),
            ": partition_bytes must be positive");
  // A duplicate of comm, so that the caller's own collectives on comm never interleave with ours.
  comm_ = comm.split(0, comm.rank());
  MOE_CHECK(comm_ != nullptr, "comm scheduler: duplicating ", comm.describe(), " failed");
  if (preemption == Preemption::caller) a2a_comm_ = comm.split(0, comm.rank());
  thread_ = std::thread([this] { run(); });
}

CommScheduler::~CommScheduler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    paused_ = false;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (const auto& [id, state] : tickets_)
    if (state.error)
      MOE_LOG_ERROR("comm scheduler: ", comm_op_kind_name(state.kind), " ticket ", id,
                    " failed and nobody waited for it: ", what_of(state.error));
}

void CommScheduler::check_usable() const {
  if (broken_)
    throw Error(str("comm scheduler on ", comm_->describe(),
                    " is unusable: agreeing on the issue order failed: ", what_of(broken_)));
}

Ticket CommScheduler::all_reduce(Tensor& buf, ReduceOp op, Communicator* group) {
  MOE_CHECK(buf.defined(), "comm scheduler all_reduce: buffer ", buf.describe(), " is undefined");
  std::vector<Piece> pieces;
  const int64_t numel = buf.numel();
  Tensor flat = buf.reshape({numel});
  if (mode_ == SchedulerMode::off) {
    pieces.push_back({.kind = CommOpKind::all_reduce,
                      .chunks = 1,
                      .buf = flat,
                      .op = op,
                      .bytes = static_cast<int64_t>(flat.nbytes()),
                      .group = group});
  } else {
    // Element-aligned micro-ops; an empty tensor still makes one (empty) piece, so that the
    // backend's argument checks run on it as they would on a direct call.
    const int64_t per_chunk =
        std::max<int64_t>(1, static_cast<int64_t>(partition_bytes_ / dtype_size(buf.dtype())));
    const int64_t chunks = std::max<int64_t>(1, (numel + per_chunk - 1) / per_chunk);
    pieces.reserve(static_cast<size_t>(chunks));
    for (int64_t c = 0; c < chunks; ++c) {
      Tensor view = flat.rows(std::min(numel, c * per_chunk), std::min(numel, (c + 1) * per_chunk));
      const auto bytes = static_cast<int64_t>(view.nbytes());
      pieces.push_back({.kind = CommOpKind::all_reduce,
                        .chunk = c,
                        .chunks = chunks,
                        .buf = std::move(view),
                        .op = op,
                        .bytes = bytes,
                        .group = group});
    }
  }

  std::unique_lock<std::mutex> lock(mutex_);
  check_usable();
  const uint64_t id = next_ticket_++;
  tickets_[id] = {CommOpKind::all_reduce, static_cast<int64_t>(pieces.size()), nullptr};
  stats_.all_reduce.ops += 1;
  for (Piece& piece : pieces) {
    piece.ticket = id;
    piece.sequence = next_sequence_++;
    low_.push_back(std::move(piece));
  }
  lock.unlock();
  work_cv_.notify_one();
  return Ticket{id};
}

Ticket CommScheduler::all_to_all_v(const Tensor& send, std::vector<int64_t> send_counts,
                                   Tensor& recv, std::vector<int64_t> recv_counts,
                                   AllToAllV* exchange) {
  MOE_CHECK(send.defined() && recv.defined(), "comm scheduler all_to_all_v: send ", send.describe(),
            " or recv ", recv.describe(), " is undefined");
  if (mode_ == SchedulerMode::priority && preemption_ == Preemption::caller)
    return all_to_all_now(send, send_counts, recv, recv_counts, exchange);
  Piece piece{.kind = CommOpKind::all_to_all,
              .chunks = 1,
              .buf = send,
              .recv = recv,
              .send_counts = std::move(send_counts),
              .recv_counts = std::move(recv_counts),
              .bytes = static_cast<int64_t>(send.nbytes() + recv.nbytes()),
              .exchange = exchange};

  std::unique_lock<std::mutex> lock(mutex_);
  check_usable();
  const uint64_t id = next_ticket_++;
  tickets_[id] = {CommOpKind::all_to_all, 1, nullptr};
  stats_.all_to_all.ops += 1;
  piece.ticket = id;
  piece.sequence = next_sequence_++;
  // Off mode keeps one FIFO; priority mode gives all-to-all its own queue that goes first.
  (mode_ == SchedulerMode::priority ? high_ : low_).push_back(std::move(piece));
  lock.unlock();
  work_cv_.notify_one();
  return Ticket{id};
}

Ticket CommScheduler::all_to_all_now(const Tensor& send, const std::vector<int64_t>& send_counts,
                                     Tensor& recv, const std::vector<int64_t>& recv_counts,
                                     AllToAllV* exchange) {
  std::unique_lock<std::mutex> lock(mutex_);
  check_usable();
  const uint64_t id = next_ticket_++;
  stats_.all_to_all.ops += 1;
  preempting_ = true;
  lock.unlock();
  Timer timer;
  std::exception_ptr error;
  try {
    if (exchange)
      exchange->run(send, send_counts, recv, recv_counts);
    else
      a2a_comm_->all_to_all_v(send, send_counts, recv, recv_counts);
  } catch (...) {
    error = std::current_exception();
  }
  const double seconds = timer.seconds();
  lock.lock();
  preempting_ = false;
  CommOpStats& stats = stats_.all_to_all;
  stats.pieces += 1;
  stats.bytes += static_cast<int64_t>(send.nbytes() + recv.nbytes());
  stats.comm_seconds += seconds;
  log_.push_back({id, ~uint64_t{0}, CommOpKind::all_to_all, 0, 1, error != nullptr});
  lock.unlock();
  work_cv_.notify_all();
  if (error) std::rethrow_exception(error);
  return Ticket{id};
}

// ---- the communication thread ------------------------------------------------------------------

void CommScheduler::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  try {
    for (;;) {
      Piece piece;
      if (!next_piece(piece, lock)) return;
      lock.unlock();
      execute(piece);
      lock.lock();
    }
  } catch (...) {
    // Only the agreement (or an internal inconsistency) gets here: pieces' own errors are caught
    // in execute(). Without an agreed order nothing more can be issued safely.
    if (!lock.owns_lock()) lock.lock();
    broken_ = std::current_exception();
    fail_queued(broken_);
    done_cv_.notify_all();
  }
}

// With the mutex held on entry and exit: waits for work, agrees on the limit (priority mode, with
// the mutex released) and pops the piece to issue. False when stopping with nothing left.
bool CommScheduler::next_piece(Piece& out, std::unique_lock<std::mutex>& lock) {
  auto has_work = [this] { return !high_.empty() || !low_.empty(); };
  work_cv_.wait(
      lock, [&] { return (!paused_ && !preempting_ && has_work()) || (stopping_ && !has_work()); });
  if (!has_work()) return false;

  if (mode_ == SchedulerMode::off || preemption_ == Preemption::caller) {  // first in, first out
    out = std::move(low_.front());
    low_.pop_front();
    return true;
  }

  // Pieces submitted here so far; the minimum over ranks bounds what may be chosen from.
  Tensor submitted = Tensor::empty({1}, DType::i64);
  submitted.data<int64_t>()[0] = static_cast<int64_t>(next_sequence_);
  lock.unlock();
  Timer timer;
  comm_->all_reduce(submitted, ReduceOp::min);
  const double seconds = timer.seconds();
  lock.lock();
  stats_.agreements += 1;
  stats_.agreement_seconds += seconds;
  const uint64_t limit = static_cast<uint64_t>(submitted.data<int64_t>()[0]);

  std::deque<Piece>* from = nullptr;
  if (!high_.empty() && high_.front().sequence < limit)
    from = &high_;
  else if (!low_.empty() && low_.front().sequence < limit)
    from = &low_;
  // Every rank has issued the same pieces and holds one more, so some piece below the limit is
  // queued; otherwise ranks submitted different sequences.
  MOE_CHECK(from != nullptr, "comm scheduler on ", comm_->describe(),
            ": no queued piece below the agreed limit ", limit,
            " (ranks submitted different operations?)");
  out = std::move(from->front());
  from->pop_front();
  return true;
}

void CommScheduler::execute(Piece& piece) {
  std::exception_ptr error;
  Timer timer;
  try {
    if (piece.kind == CommOpKind::all_reduce)
      (piece.group ? *piece.group : *comm_).all_reduce(piece.buf, piece.op);
    else if (piece.exchange)
      piece.exchange->run(piece.buf, piece.send_counts, piece.recv, piece.recv_counts);
    else
      comm_->all_to_all_v(piece.buf, piece.send_counts, piece.recv, piece.recv_counts);
  } catch (...) {
    error = std::current_exception();
  }
  const double seconds = timer.seconds();

  std::lock_guard<std::mutex> lock(mutex_);
  CommOpStats& stats = stats_of(stats_, piece.kind);
  stats.pieces += 1;
  stats.bytes += piece.bytes;
  stats.comm_seconds += seconds;
  log_.push_back(
      {piece.ticket, piece.sequence, piece.kind, piece.chunk, piece.chunks, error != nullptr});
  TicketState& state = tickets_.at(piece.ticket);
  state.remaining -= 1;
  if (error && !state.error) state.error = error;
  done_cv_.notify_all();
}

void CommScheduler::fail_queued(std::exception_ptr error) {
  for (std::deque<Piece>* queue : {&high_, &low_}) {
    for (const Piece& piece : *queue) {
      TicketState& state = tickets_.at(piece.ticket);
      state.remaining -= 1;
      if (!state.error) state.error = error;
    }
    queue->clear();
  }
}

// ---- tickets
// -------------------------------------------------------------------------------------

void CommScheduler::wait_locked(uint64_t id, std::unique_lock<std::mutex>& lock) {
  auto it = tickets_.find(id);
  if (it == tickets_.end() || it->second.remaining == 0) return;
  MOE_CHECK(!paused_, "comm scheduler: waiting on ", comm_op_kind_name(it->second.kind), " ticket ",
            id, " while paused would never return (resume() first)");
  const CommOpKind kind = it->second.kind;
  Timer timer;
  done_cv_.wait(lock, [&] {
    auto found = tickets_.find(id);
    return found == tickets_.end() || found->second.remaining == 0;
  });
  stats_of(stats_, kind).wait_seconds += timer.seconds();
}

void CommScheduler::wait(Ticket ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  MOE_CHECK(ticket.id < next_ticket_, "comm scheduler: wait on ticket ", ticket.id,
            " that this scheduler never issued (", next_ticket_, " issued)");
  wait_locked(ticket.id, lock);
  auto it = tickets_.find(ticket.id);
  if (it == tickets_.end()) return;
  std::exception_ptr error = it->second.error;
  tickets_.erase(it);
  lock.unlock();
  if (error) std::rethrow_exception(error);
}

bool CommScheduler::done(Ticket ticket) const {
  std::lock_guard<std::mutex> lock(mutex_);
  MOE_CHECK(ticket.id < next_ticket_, "comm scheduler: done() on ticket ", ticket.id,
            " that this scheduler never issued (", next_ticket_, " issued)");
  auto it = tickets_.find(ticket.id);
  return it == tickets_.end() || it->second.remaining == 0;
}

void CommScheduler::wait_all() {
  std::unique_lock<std::mutex> lock(mutex_);
  std::vector<uint64_t> ids;
  for (const auto& entry : tickets_) ids.push_back(entry.first);
  for (uint64_t id : ids) wait_locked(id, lock);

  std::exception_ptr first;
  for (uint64_t id : ids) {
    auto it = tickets_.find(id);
    if (it == tickets_.end()) continue;
    if (!it->second.error) {
      tickets_.erase(it);
    } else if (!first) {
      first = it->second.error;
      tickets_.erase(it);
    }
  }
  lock.unlock();
  if (first) std::rethrow_exception(first);
}

void CommScheduler::pause() {
  std::lock_guard<std::mutex> lock(mutex_);
  paused_ = true;
}

void CommScheduler::resume() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    paused_ = false;
  }
  work_cv_.notify_all();
}

SchedulerStats CommScheduler::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::vector<ExecutedPiece> CommScheduler::execution_log() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return log_;
}

void CommScheduler::reset_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_ = SchedulerStats{};
  log_.clear();
}

}  // namespace moe::comm
