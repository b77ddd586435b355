// The decode task pool (backend/cpu/task_pool.h): every task runs exactly once whatever the thread
// count, over many batches back to back (a late worker must never run a task of a later batch);
// calls from an OpenMP region and from two threads at once run correctly; the GEMV that runs on it
// gives the same bits at 1, 2, 3 and 4 threads; and a model's decode steps (GEMVs and cached
// attention on the pool) give the bits of the OpenMP loops they replaced, at 1-3 threads.
// Shapes: out x in weights.
#include <omp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "backend/cpu/gemv.h"
#include "backend/cpu/task_pool.h"
#include "moe/infer/model.h"
#include "moe/models/transformer.h"
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

// Runs fn on its own thread and returns its result; a call still running after `seconds` is a
// hang: the test binary says so and exits at once (a hung pool cannot be unwound), where ctest's
// own timeout would report it only after 25 minutes.
template <class Fn>
auto within(int seconds, const char* what, Fn fn) {
  std::packaged_task<decltype(fn())()> task(fn);
  auto result = task.get_future();
  std::thread(std::move(task)).detach();
  if (result.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: %s did not finish within %d s (a hang)\n", what, seconds);
    std::fflush(stderr);
    std::_Exit(1);
  }
  return result.get();
}

// The pool on for one test whatever OMP_WAIT_POLICY says (it is the default only under
// passive), the default again after it.
struct PoolOn {
  PoolOn() { cpu::set_task_pool_enabled(true); }
  ~PoolOn() { cpu::set_task_pool_enabled(cpu::task_pool_default()); }
};

}  // namespace

TEST_CASE("task pool: every task runs exactly once at any thread count", "[task_pool]") {
  PoolOn on;
  for (int threads : {1, 2, 3, 4})
    for (int64_t count : {0, 1, 2, 7, 64, 513}) {
      INFO("threads " << threads << ", tasks " << count);
      CHECK(each_once(count, threads, 200));
    }
  CHECK(cpu::task_pool_workers() >= 3);  // threads - 1 workers were started for 4 threads
}

TEST_CASE("task pool: each thread works through its own contiguous range first", "[task_pool]") {
  // Two threads, 64 tasks: the caller owns tasks 0-31, the worker 32-63. Each thread claims
  // its own range in order and only then helps with the other's, so a GEMV's threads read one
  // sequential stream each. The tasks take ~200 us so that the worker wakes within the batch.
  PoolOn on;
  const int64_t count = 64;
  int batches_with_worker = 0, batch = 0;
  // Until the worker has joined 10 batches (20 here on an idle machine), or 400 batches.
  for (; batch < 400 && batches_with_worker < 10; ++batch) {
    std::vector<std::thread::id> ran_by(static_cast<size_t>(count));
    std::vector<int64_t> order(static_cast<size_t>(count));
    std::atomic<int64_t> next{0};
    auto task = [&](int64_t i) {
      ran_by[static_cast<size_t>(i)] = std::this_thread::get_id();
      order[static_cast<size_t>(next.fetch_add(1))] = i;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    };
    const std::thread::id caller = std::this_thread::get_id();
    cpu::run_tasks(count, 2, task);
    REQUIRE(next.load() == count);
    // Each thread's tasks, in the order they started.
    std::vector<int64_t> mine, other;
    for (int64_t i : order) (ran_by[static_cast<size_t>(i)] == caller ? mine : other).push_back(i);
    INFO("batch " << batch);
    REQUIRE_FALSE(mine.empty());
    CHECK(mine.front() == 0);
    // Within each range, a thread's tasks ascend.
    auto ascending_within_ranges = [&](const std::vector<int64_t>& tasks) {
      for (size_t k = 1; k < tasks.size(); ++k)
        if ((tasks[k] < count / 2) == (tasks[k - 1] < count / 2) && tasks[k] <= tasks[k - 1])
          return false;
      return true;
    };
    CHECK(ascending_within_ranges(mine));
    CHECK(ascending_within_ranges(other));
    if (!other.empty()) {
      ++batches_with_worker;
      CHECK(other.front() >= count / 2);  // the worker starts in its own range
    }
  }
  // The worker's start was checked: a machine too busy to wake it within a batch's 12 ms gets
  // more batches, up to 400 (about 5 s).
  INFO("batches run: " << batch);
  CHECK(batches_with_worker > 0);
}

TEST_CASE("task pool: batches go on across the batch counter's wrap at 2^32", "[task_pool]") {
  // A server decoding for days passes 2^32 batches (~60 a token). Just below the wrap, batches
  // must still run every task once; a counter that outgrew the claim words' 32 bits would hang
  // here.
  PoolOn on;
  CHECK(each_once(64, 2, 10));  // the worker exists and has seen a batch
  cpu::task_pool_set_generation(0xffffffffu - 3);
  // A hang fails within a minute (the 40 batches take milliseconds).
  CHECK(within(60, "batches across the wrap", [] { return each_once(64, 2, 20); }));
  CHECK(within(60, "batches across the wrap", [] { return each_once(513, 4, 20); }));
}

TEST_CASE("task pool: calls from an OpenMP region and from two threads at once", "[task_pool]") {
  PoolOn on;
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
  PoolOn on;
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

TEST_CASE("task pool: decode steps give the OpenMP path's bits at 1-3 threads", "[task_pool]") {
  // Large enough that the pool is used: expert and LM-head GEMVs of 32K+ multiply-adds, and the
  // attention over 270+ cached positions (4 heads of 32: 128 per position).
  ModelConfig c;
  c.arch = Arch::mixtral;
  c.layers = 2, c.d_model = 128, c.heads = 4, c.kv_heads = 2, c.d_ff = 256, c.seq = 320;
  c.experts = 4, c.top_k = 2, c.moe_every = 1, c.normalize_topk = true, c.vocab_size = 256;
  c.dtype = DType::bf16;
  c.resolve();
  ParamSet params(5, c.dtype);
  Transformer model(c, params);
  infer::lean_for_inference(params);
  auto decode = [&] {
    KVCache cache = model.make_cache(1);
    std::vector<int32_t> prompt;
    for (int32_t i = 0; i < 270; ++i) prompt.push_back((i * 37 + 11) % 256);
    model.forward_cached(Tensor::from_vector({270}, prompt), {270}, {0}, cache);
    std::vector<float> out;
    for (int32_t step = 0; step < 4; ++step) {
      Tensor logits = model.forward_cached(
          Tensor::from_vector({1}, std::vector<int32_t>{step * 13 + 2}), {1}, {0}, cache);
      out.insert(out.end(), logits.data<float>(), logits.data<float>() + logits.numel());
    }
    return out;
  };
  const int before = num_threads();
  set_num_threads(2);
  cpu::set_task_pool_enabled(false);
  const std::vector<float> omp = decode();
  PoolOn on;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    const std::vector<float> pool = decode();
    INFO("threads " << threads);
    REQUIRE(pool.size() == omp.size());
    CHECK(std::memcmp(pool.data(), omp.data(), omp.size() * sizeof(float)) == 0);
  }
  set_num_threads(before);
  CHECK(omp.size() == 4 * 256);
}
