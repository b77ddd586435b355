// ZeroPrefetch (see moe/parallel/zero_prefetch.h): --zero 3's all-gathers N groups ahead of
// compute, on a thread of their own over a duplicate communicator. L blocks; entry k of a pass's
// order is the k-th gather() call of Transformer::forward_backward.
#include "moe/parallel/zero_prefetch.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>

#ifdef MOE_HAVE_MPI
#include "moe/comm/mpi.h"
#endif
#include "moe/error.h"
#include "moe/log.h"
#include "moe/settings.h"
#include "moe/timer.h"

namespace moe::parallel {

namespace {

struct Job {
  int64_t group = 0;
  GatherJob work;
  std::vector<Tensor> values;
  std::exception_ptr error;
  bool done = false;
};

}  // namespace

struct ZeroPrefetch::Shared {
  std::unique_ptr<comm::Communicator> comm;  // the thread's duplicate of the group
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Job>> todo;     // the thread's queue, in the order's order
  std::deque<std::shared_ptr<Job>> pending;  // the caller's: submitted, not yet installed
  bool stopping = false, abandoned = false;
  double busy_seconds = 0;
  int64_t gathers = 0;
};

namespace {

// The prefetch thread: every job in submission order (the order every rank submits them), so
// the collectives on the duplicate match across ranks. It owns a reference to the shared state,
// so a detached thread (abandoned) never touches freed memory.
void prefetch_loop(const std::shared_ptr<ZeroPrefetch::Shared>& s) {
  std::unique_lock<std::mutex> lock(s->mu);
  while (true) {
    s->cv.wait(lock, [&] { return s->stopping || !s->todo.empty(); });
    if (s->abandoned || s->todo.empty()) break;  // stopping: the queue drained first
    const std::shared_ptr<Job> job = s->todo.front();
    s->todo.pop_front();
    lock.unlock();
    Timer timer;
    try {
      job->values = job->work.run(*s->comm);
    } catch (...) {
      job->error = std::current_exception();
    }
    const double seconds = timer.seconds();
    lock.lock();
    job->done = true;
    s->busy_seconds += seconds;
    ++s->gathers;
    s->cv.notify_all();
  }
  // Abandoned during a failure: MPI may be finalised or aborted by now; never free MPI objects.
  if (s->abandoned) (void)s->comm.release();
}

}  // namespace

ZeroPrefetch::ZeroPrefetch(DenseShards& shards, comm::Communicator& group, int64_t depth)
    : shards_(shards), depth_(depth), shared_(std::make_shared<Shared>()) {
  MOE_USAGE_CHECK(depth >= 0, flag_for(Setting::zero_prefetch),
                  " must be 0 (off) or more blocks ahead (got ", depth, ")");
  MOE_CHECK(shards.stage() >= 3, "ZeroPrefetch: ", flag_for(Setting::zero_prefetch), " needs ",
            flag_for(Setting::zero), " 3 (stage ", shards.stage(), ")");
#ifdef MOE_HAVE_MPI
  if (depth > 0 && group.name() == "mpi" && !comm::mpi_thread_multiple()) {
    // Two threads may not call MPI at once: the all-gathers stay on the caller's thread.
    MOE_LOG_WARN(flag_for(Setting::zero_prefetch), " ", depth, ": MPI granted thread level ",
                 comm::mpi_thread_level(),
                 ", not MPI_THREAD_MULTIPLE; the dense all-gathers run synchronously (as 0)");
    depth_ = 0;
  }
#endif
  if (depth_ == 0) return;
  // A duplicate, so that our all-gathers never interleave with the caller's collectives.
  shared_->comm = group.split(0, group.rank());
  MOE_CHECK(shared_->comm != nullptr, flag_for(Setting::zero_prefetch), ": duplicating ",
            group.describe(), " failed");
  thread_ = std::thread([s = shared_] { prefetch_loop(s); });
}

ZeroPrefetch::~ZeroPrefetch() {
  if (!thread_.joinable()) return;
  // Unwinding (this rank failed): the peers may never run the collectives still queued, so a
  // join could wait forever; the thread is left to the process's end (the tool aborts the job).
  const bool failing = std::uncaught_exceptions() > 0;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stopping = true;
    shared_->abandoned = failing;
  }
  shared_->cv.notify_all();
  if (failing)
    thread_.detach();
  else
    thread_.join();
  for (const std::shared_ptr<Job>& job : shared_->pending)
    if (job->done && job->error) try {
        std::rethrow_exception(job->error);
      } catch (const std::exception& e) {
        MOE_LOG_ERROR(flag_for(Setting::zero_prefetch),
                      ": an all-gather nobody waited for failed: ", e.what());
      }
}

std::vector<int64_t> ZeroPrefetch::pass_order(int64_t blocks, bool training) {
  std::vector<int64_t> order;
  if (training) order.push_back(-1);
  for (int64_t i = 0; i < blocks; ++i) order.push_back(i);
  for (int64_t i = blocks; training && i-- > 0;) order.push_back(i);
  return order;
}

void ZeroPrefetch::begin_pass(int64_t blocks, bool training) {
  if (depth_ == 0) return;
  drain();  // a pass that ended early (its peers ran the same prefetches: they completed)
  order_ = pass_order(blocks, training);
  next_ = submitted_ = 0;
  submit_through(static_cast<size_t>(depth_));
}

void ZeroPrefetch::submit_through(size_t k) {
  std::vector<std::shared_ptr<Job>> jobs;
  for (; submitted_ <= k && submitted_ < order_.size(); ++submitted_) {
    auto job = std::make_shared<Job>();
    job->group = order_[submitted_];
    job->work = shards_.job(job->group);
    jobs.push_back(job);
  }
  if (jobs.empty()) return;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    for (const std::shared_ptr<Job>& job : jobs) {
      shared_->todo.push_back(job);
      shared_->pending.push_back(job);
    }
  }
  shared_->cv.notify_all();
}

void ZeroPrefetch::drain() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  for (const std::shared_ptr<Job>& job : shared_->pending)
    shared_->cv.wait(lock, [&] { return job->done; });
  shared_->pending.clear();
  order_.clear();
  next_ = submitted_ = 0;
}

void ZeroPrefetch::gather(int64_t g, bool backward) {
  if (depth_ == 0 || next_ >= order_.size() || order_[next_] != g) {
    // Synchronous: --zero-prefetch 0, or a call the order did not foresee (nothing further is
    // prefetched this pass; every rank makes the same calls, so every rank falls back here).
    if (depth_ > 0) {
      if (!order_.empty()) ++stats_.out_of_order;
      drain();
    }
    const bool needed = !shards_.gathered(g);
    Timer timer;
    shards_.gather(g, backward);
    const double seconds = timer.seconds();
    stats_.wait_seconds += seconds;
    if (needed) {
      stats_.gather_seconds += seconds;
      ++stats_.gathers;
    }
    return;
  }
  // Entries before next_ are released (all but group -1): starting up to next_ + N keeps at
  // most N + 1 blocks' values alive, this one's included.
  submit_through(next_ + static_cast<size_t>(depth_));
  std::shared_ptr<Job> job;
  Timer waited;
  {
    std::unique_lock<std::mutex> lock(shared_->mu);
    job = shared_->pending.front();
    shared_->pending.pop_front();
    shared_->cv.wait(lock, [&] { return job->done; });
  }
  stats_.wait_seconds += waited.seconds();
  ++next_;
  if (job->error) std::rethrow_exception(job->error);
  shards_.install(g, std::move(job->values), backward);
}

void ZeroPrefetch::release(int64_t g, bool reduce_grads) { shards_.release(g, reduce_grads); }

PrefetchStats ZeroPrefetch::take_stats() {
  PrefetchStats out = stats_;
  stats_ = {};
  std::lock_guard<std::mutex> lock(shared_->mu);
  out.gather_seconds += shared_->busy_seconds;
  out.gathers += shared_->gathers;
  shared_->busy_seconds = 0;
  shared_->gathers = 0;
  return out;
}

}  // namespace moe::parallel
