// The decode task pool (see task_pool.h). One batch at a time. The tasks are cut into one
// contiguous range per thread (the caller's first); each thread claims its own range's tasks in
// order, then helps the other ranges the same way. A range's generation and its next unclaimed
// task share one 64-bit word, so a worker that wakes late and claims with the generation it saw
// cannot take a task of a later batch (its compare-and-swap fails).
#include "backend/cpu/task_pool.h"

#include <omp.h>
#include <pthread.h>
#include <strings.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MOE_POOL_PAUSE() _mm_pause()
#else
#define MOE_POOL_PAUSE() ((void)0)
#endif

namespace moe::cpu {
namespace {

thread_local bool in_worker = false;

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// `text` without leading and trailing white space equals `word`, case aside (GNU OpenMP's reading
// of OMP_WAIT_POLICY).
bool names(const char* text, const char* word) {
  while (is_space(*text)) ++text;
  const size_t length = std::strlen(word);
  if (strncasecmp(text, word, length) != 0) return false;
  for (text += length; is_space(*text);) ++text;
  return *text == '\0';
}

// GOMP_SPINCOUNT as GNU OpenMP reads it: "infinite" or "infinity", or a decimal count with an
// optional k, M, G or T (powers of 1,000), white space around either; false when it cannot be
// read (libgomp then keeps its default).
bool spin_count_value(const char* text, uint64_t& polls) {
  while (is_space(*text)) ++text;
  const char* rest = text;
  uint64_t scale = 1;
  if (strncasecmp(text, "infinite", 8) == 0 || strncasecmp(text, "infinity", 8) == 0) {
    polls = ~uint64_t(0);
    rest = text + 8;
  } else {
    if (!std::isdigit(static_cast<unsigned char>(*text))) return false;
    errno = 0;
    char* end = nullptr;
    polls = std::strtoull(text, &end, 10);
    if (errno != 0) return false;
    for (rest = end; is_space(*rest);) ++rest;
    const char* suffixes = "kmgt";
    const char* suffix =
        *rest ? std::strchr(suffixes, std::tolower(static_cast<unsigned char>(*rest))) : nullptr;
    if (suffix) {
      for (const char* s = suffixes; s <= suffix; ++s) scale *= 1000;
      ++rest;
    }
    if (polls > ~uint64_t(0) / scale) return false;
    polls *= scale;
  }
  while (is_space(*rest)) ++rest;
  return *rest == '\0';
}

bool policy_is(const char* word) {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  return policy && names(policy, word);
}

bool pool_enabled = task_pool_default();

// How long an idle worker spins before it sleeps, from OMP_WAIT_POLICY (see task_pool.h).
std::chrono::microseconds idle_spin() {
  if (policy_is("passive")) return std::chrono::microseconds(0);
  if (policy_is("active")) return std::chrono::microseconds(1000);
  return std::chrono::microseconds(20);
}

// A child of fork() has none of its parent's workers (and maybe a mutex a worker held): it runs
// every batch inline.
std::atomic<bool> forked{false};

// Never destroyed: its workers sleep until the process ends (joining them at exit would race
// with other static destructors, and a forked child could not join its parent's threads).
class Pool {
 public:
  // Threads a batch may use (caller included); more run as this many.
  static constexpr int kMaxThreads = 64;

  Pool() {
    pthread_atfork(nullptr, nullptr, [] { forked.store(true, std::memory_order_relaxed); });
  }

  void run(int64_t count, int threads, TaskFn fn, void* context) {
    std::unique_lock<std::mutex> batch(batch_mutex_, std::try_to_lock);
    if (!batch.owns_lock() || in_worker || threads <= 1 || count <= 1 || omp_in_parallel() ||
        forked.load(std::memory_order_relaxed) || count >= (int64_t(1) << 31)) {
      for (int64_t i = 0; i < count; ++i) fn(context, i);
      return;
    }
    threads = std::min(threads, kMaxThreads);
    for (int id = workers_.load(); id < threads - 1; workers_.store(++id))
      std::thread([this, id] { work(id); }).detach();
    // 32 bits, as the claim words hold it (a long-running server passes 2^32 batches: a count
    // that outgrew them would never match a claim word again).
    const uint64_t generation = (generation_.load(std::memory_order_relaxed) + 1) & 0xffffffffu;
    fn_.store(fn, std::memory_order_relaxed);
    context_.store(context, std::memory_order_relaxed);
    ranges_.store(threads, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    // Range r: tasks [count r / threads, count (r + 1) / threads), each thread's reads one
    // sequential stream through memory as far as its own range lasts.
    for (int r = 0; r < threads; ++r) {
      range_[r].end.store(count * (r + 1) / threads, std::memory_order_relaxed);
      range_[r].claim.store(generation << 32 | uint64_t(count * r / threads),
                            std::memory_order_relaxed);
    }
    generation_.store(generation, std::memory_order_release);  // publishes the fields above
    {
      std::lock_guard<std::mutex> lock(sleep_mutex_);  // a sleeper checks its wait under it
      if (sleepers_ > 0) wake_.notify_all();
    }
    take(generation, 0);
    // Only tasks that another thread has claimed are left: wait for those.
    for (int spins = 0; done_.load(std::memory_order_acquire) < count; ++spins) {
      if (spins < 4096) {
        MOE_POOL_PAUSE();
      } else {
        std::this_thread::yield();  // its claimer was descheduled: let it run
      }
    }
  }

  int workers() const { return workers_.load(); }
  uint32_t batches() const { return static_cast<uint32_t>(generation_.load()); }

  void set_generation(uint32_t batches) {
    std::lock_guard<std::mutex> batch(batch_mutex_);
    generation_.store(batches);
  }

 private:
  // Claims and runs tasks of `generation`: range `own`'s in order, then each other range's, until
  // none is left. A worker beyond the batch's ranges (more awake than it asked for) starts at range
  // own % ranges, which spreads such helpers over the ranges.
  void take(uint64_t generation, int own) {
    const int ranges = ranges_.load(std::memory_order_relaxed);
    for (int k = 0; k < ranges; ++k) {
      Range& range = range_[(own + k) % ranges];
      for (;;) {
        uint64_t c = range.claim.load(std::memory_order_acquire);
        if ((c >> 32) != generation) return;  // a later batch: nothing of ours is left
        const int64_t task = static_cast<int64_t>(c & 0xffffffffu);
        // end may already be a later batch's: then the generation has moved and the CAS fails.
        if (task >= range.end.load(std::memory_order_relaxed)) break;
        if (!range.claim.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) continue;
        // The claimed task pins the batch: its fields cannot change until done_ counts it.
        fn_.load(std::memory_order_relaxed)(context_.load(std::memory_order_relaxed), task);
        done_.fetch_add(1, std::memory_order_release);
      }
    }
  }

  void work(int id) {
    in_worker = true;
    const std::chrono::microseconds spin = idle_spin();
    uint64_t seen = 0;  // the last generation this worker looked at
    for (;;) {
      auto moved = [&] { return generation_.load(std::memory_order_acquire) != seen; };
      if (!moved()) {
        const auto until = std::chrono::steady_clock::now() + spin;
        for (int i = 1; !moved(); ++i) {
          MOE_POOL_PAUSE();
          if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
        }
      }
      if (!moved()) {
        std::unique_lock<std::mutex> lock(sleep_mutex_);
        ++sleepers_;
        wake_.wait(lock, moved);
        --sleepers_;
      }
      seen = generation_.load(std::memory_order_acquire);
      // Worker id owns range id + 1 (the caller's is 0); a worker beyond the batch's threads
      // stays out of it.
      if (id + 1 < ranges_.load(std::memory_order_relaxed)) take(seen, id + 1);
    }
  }

  // One thread's contiguous share of a batch; a cache line each (the claims are contended).
  struct alignas(64) Range {
    std::atomic<uint64_t> claim{0};  // generation << 32 | next task
    std::atomic<int64_t> end{0};     // one past the range's last task
  };

  std::mutex batch_mutex_;               // one batch at a time
  std::atomic<int> workers_{0};          // started (detached), ids 0 .. workers_ - 1
  std::atomic<uint64_t> generation_{0};  // the latest batch's (32 bits); workers wait for a change
  Range range_[kMaxThreads];
  std::atomic<int> ranges_{0};  // the batch's threads, caller included
  std::atomic<int64_t> done_{0};
  std::atomic<TaskFn> fn_{nullptr};
  std::atomic<void*> context_{nullptr};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  int sleepers_ = 0;
};

Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

}  // namespace

void run_tasks(int64_t count, int threads, TaskFn fn, void* context) {
  if (!pool_enabled) {
#pragma omp parallel for schedule(static) \
    num_threads(threads > 1 ? threads : 1) if (threads > 1 && count > 1)
    for (int64_t i = 0; i < count; ++i) fn(context, i);
    return;
  }
  pool().run(count, threads, fn, context);
}

void set_task_pool_enabled(bool enabled) { pool_enabled = enabled; }

bool task_pool_enabled() { return pool_enabled; }

bool task_pool_preferred(const char* wait_policy, const char* spin_count) {
  if (wait_policy && names(wait_policy, "passive")) return true;
  if (wait_policy && names(wait_policy, "active")) return false;
  uint64_t polls = 0;
  return spin_count && spin_count_value(spin_count, polls) && polls < kShortSpinCount;
}

bool task_pool_default() {
  return task_pool_preferred(std::getenv("OMP_WAIT_POLICY"), std::getenv("GOMP_SPINCOUNT"));
}

int task_pool_workers() { return pool().workers(); }

uint32_t task_pool_batches() { return pool().batches(); }

void task_pool_set_generation(uint32_t batches) { pool().set_generation(batches); }

}  // namespace moe::cpu
