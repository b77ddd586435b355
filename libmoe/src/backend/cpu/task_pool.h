// A persistent pool of worker threads for short batches of independent tasks (decode GEMVs, and
// the tiles of every tiled sgemm while the pool is enabled: gemm.cpp): the calling thread works
// through the tasks itself, and the workers that are awake help it.
//
// Why not an OpenMP loop: a decode step opens ~60 parallel regions of 10-100 us of work each, and
// an OpenMP region ends with a join that waits for every thread of the team. A worker that sleeps
// (OMP_WAIT_POLICY=passive: a futex wake-up, tens of microseconds) or has been descheduled (a
// shared machine) holds up each region for its whole delay, whether or not it found work to do.
// Here the tasks are cut into one contiguous range per thread; each thread claims its own range's
// tasks one at a time, in order, then helps with the others' (so a GEMV's threads each read one
// sequential stream of weight rows, as under OpenMP's static schedule, where one shared counter
// dealt neighbouring tasks to alternate threads and read 0.73-0.95x as fast; docs/PERFORMANCE.md,
// "Decode"). The caller waits only for the tasks another thread has claimed: a late worker finds
// its range taken over and holds no one up.
//
// Results do not depend on which thread runs a task (each task computes its own outputs in a
// fixed order), so callers stay bitwise reproducible at any thread count.
//
// Waiting: a worker spins for a while after its last task before it sleeps (none with
// OMP_WAIT_POLICY=passive, 20 us when unset, 1 ms with active: the policy the user chose for
// OpenMP's threads, read, never set). 20 us spans the gaps between a decode step's batches; longer
// spins lost on a loaded machine (a spinning worker takes the core its caller needs). Calls from
// inside an OpenMP parallel region, from a worker, or while another thread's batch is running, run
// their tasks inline on the calling thread.
#pragma once
#include <cstdint>

namespace moe::cpu {

using TaskFn = void (*)(void* context, int64_t task);

// Calls fn(context, i) exactly once for every i in [0, count), on the calling thread and up to
// `threads` - 1 workers; returns when all have returned. fn must not throw.
void run_tasks(int64_t count, int threads, TaskFn fn, void* context);

template <class F>
void run_tasks(int64_t count, int threads, F& f) {
  run_tasks(
      count, threads, [](void* c, int64_t i) { (*static_cast<F*>(c))(i); }, &f);
}

// Workers started so far (tests).
int task_pool_workers();
// Batches the pool has handed to its workers so far, mod 2^32 (tests: whether a call used it).
uint32_t task_pool_batches();
// Tests: sets the pool's batch counter, as if `batches` batches (mod 2^32) had run. The counter
// wraps at 2^32, which a long-running server passes; tests start just below it.
void task_pool_set_generation(uint32_t batches);

// Whether batches run on the pool (else each batch is an OpenMP loop, schedule static,
// `threads` threads; sgemm's tiles then run as an OpenMP loop of its own, schedule dynamic). The
// default, task_pool_default(), is task_pool_preferred() of this process's OMP_WAIT_POLICY and
// GOMP_SPINCOUNT. Benchmarks and tests switch it to time or check both paths. Not thread-safe with
// batches in flight.
void set_task_pool_enabled(bool enabled);
bool task_pool_enabled();
bool task_pool_default();

// GOMP_SPINCOUNT below this many polls counts as short (task_pool_preferred). Training lost 4-11%
// of its quiet speed at 1,000 and 3,000 polls and none at 10,000 (docs/PERFORMANCE-NOTEBOOK.md,
// "A CPU shared with other work"): below it OpenMP's idle threads fall asleep in the gaps between
// a step's regions, so a decode step's ~60 regions would each wait for a wake-up too.
constexpr uint64_t kShortSpinCount = 10000;

// The pool or OpenMP loops for decode, from OMP_WAIT_POLICY and GOMP_SPINCOUNT as the environment
// holds them (null when unset), read as GNU OpenMP reads them. The pool where OpenMP's idle
// threads sleep between regions, so that every region's join would wait for a wake-up (8-30 us;
// the pool avoids it): under OMP_WAIT_POLICY=passive, and, with neither passive nor active given,
// under a GOMP_SPINCOUNT below kShortSpinCount (the tools start with 1,000:
// tools/common/omp_wait.h). The OpenMP loops where the threads spin through the gaps (a join then
// costs about 1 us, and the pool's workers would compete with the spinning threads for the cores:
// docs/PERFORMANCE.md, "Decode"): under OMP_WAIT_POLICY=active whatever the spin count (the
// user's explicit choice), and under libgomp's default or a long or unreadable GOMP_SPINCOUNT
// (libgomp ignores one it cannot read).
bool task_pool_preferred(const char* wait_policy, const char* spin_count);

}  // namespace moe::cpu
