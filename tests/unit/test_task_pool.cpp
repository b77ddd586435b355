// The decode task pool (backend/cpu/task_pool.h): every task runs exactly once whatever the thread
// count, over many batches back to back (a late worker must never run a task of a later batch);
// calls from an OpenMP region and from two threads at once run correctly; and the GEMV that runs
// on it gives the same bits at 1, 2, 3 and 4 threads. Shapes: out x in weights.
#include <omp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/cpu/gemv.h"
#include "backend/cpu/task_pool.h"
#include "moe/rng.h"
#include "moe/threads.h"

using namespace moe;

namespace {

// Runs `batches` batches of `count` tasks, each task adding (batch + 1) to its own slot; returns
// whether every slot holds the sum over batches (each task of each batch ran exactly once).
bool each_once(int64_t count, int threads, int batches) {
  std::vector<std::atomic<int64_t>> slots(static_cast<size_t>(count));
  for (auto& s : slots) s.store(0);
  int64_t expect = 0;
  for (int b = 0; b < batches; ++b) {
    auto task = [&](int64_t i) { slots[static_cast<size_t>(i)].fetch_add(b + 1); };
    cpu::run_tasks(count, threads, task);
    expect += b + 1;
  }
  for (const auto& s : slots)
    if (s.load() != expect) return false;
  return true;
}

}  // namespace

TEST_CASE("task pool: every task runs exactly once at any thread count", "[task_pool]") {
  for (int threads : {1, 2, 3, 4})
    for (int64_t count : {0, 1, 2, 7, 64, 513}) {
      INFO("threads " << threads << ", tasks " << count);
      CHECK(each_once(count, threads, 200));
    }
  CHECK(cpu::task_pool_workers() >= 3);  // threads - 1 workers were started for 4 threads
}

TEST_CASE("task pool: calls from an OpenMP region and from two threads at once", "[task_pool]") {
  // Inside a parallel region each thread's batch runs inline on that thread.
  std::atomic<int> failures{0};
#pragma omp parallel num_threads(2)
  {
    if (!each_once(100, 2, 20)) ++failures;
  }
  CHECK(failures.load() == 0);
  // Two host threads: one gets the pool, the other runs its batch inline; both are complete.
  bool a = false, b = false;
  std::thread first([&] { a = each_once(300, 2, 300); });
  std::thread second([&] { b = each_once(300, 2, 300); });
  first.join();
  second.join();
  CHECK(a);
  CHECK(b);
}

TEST_CASE("task pool: the GEMV gives the same bits at 1, 2, 3 and 4 threads", "[task_pool]") {
  const int64_t out = 700, in = 333, m = 3;
  std::vector<float> w(static_cast<size_t>(out * in)), x(static_cast<size_t>(m * in));
  for (size_t j = 0; j < w.size(); ++j) w[j] = rng_normal(11, j);
  for (size_t j = 0; j < x.size(); ++j) x[j] = rng_normal(12, j);
  const cpu::WeightMatrix weights{cpu::WeightFormat::f32, w.data(), out, in};
  auto product = [&] {
    std::vector<float> y(static_cast<size_t>(m * out), -1.0f);
    const cpu::GemvProblem p{weights, x.data(), in, m, y.data(), out, 0.0f};
    cpu::gemv_batch(&p, 1);
    return y;
  };
  const int before = num_threads();
  set_num_threads(1);
  const std::vector<float> one = product();
  for (int threads : {2, 3, 4}) {
    set_num_threads(threads);
    const std::vector<float> many = product();
    INFO("threads " << threads);
    CHECK(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)) == 0);
  }
  set_num_threads(before);
  // Not trivially equal: every output was written (the fill value is gone) and is a real dot.
  double expect = 0;
  for (int64_t j = 0; j < in; ++j)
    expect += double(w[static_cast<size_t>(j)]) * x[static_cast<size_t>(j)];
  CHECK(one[0] == Approx(expect).epsilon(1e-4));
}
