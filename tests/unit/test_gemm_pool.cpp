// The tiled sgemm on the decode task pool (backend/cpu/gemm.cpp, task_pool.h): where OpenMP's
// idle threads sleep between regions (the tools' short GOMP_SPINCOUNT) the tiles run as pool
// tasks, so that a thread still waking up, or descheduled on a shared CPU, holds no product up.
// Which thread runs a tile never changes its bits: the pool's products equal the OpenMP loop's
// at 1-4 threads, with each kernel the CPU has, and a training run gives the same checkpoint bits
// either way (a guard: the first test is the one that fails where the tiles never reach the pool).
#include <catch2/catch.hpp>
#include <cstring>
#include <tuple>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/task_pool.h"
#include "moe/threads.h"
#include "moe/train/trainer.h"
#include "support/bits.h"
#include "support/gradcheck.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;

namespace {

// The pool on or off for one scope, the process's default again after it; the thread count and
// the GEMM kernel are restored too.
struct PoolSetting {
  explicit PoolSetting(bool on) { cpu::set_task_pool_enabled(on); }
  ~PoolSetting() {
    cpu::set_task_pool_enabled(cpu::task_pool_default());
    set_num_threads(threads);
    cpu::set_gemm_kernel(kernel);
  }
  int threads = num_threads();
  cpu::GemmKernel kernel = cpu::gemm_kernel();
};

// C = A B (transposes as given) for random operands; C starts random, beta 1 adds it in.
std::vector<float> product(int64_t m, int64_t n, int64_t k, bool ta, bool tb, uint64_t seed) {
  const Tensor a = test::random_tensor({ta ? k : m, ta ? m : k}, seed);
  const Tensor b = test::random_tensor({tb ? n : k, tb ? k : n}, seed + 1);
  Tensor c = test::random_tensor({m, n}, seed + 2);
  cpu::sgemm(ta, tb, m, n, k, 1.0f, a.data<float>(), ta ? m : k, b.data<float>(), tb ? k : n, 1.0f,
             c.data<float>(), n);
  const float* cs = c.data<float>();
  return std::vector<float>(cs, cs + m * n);
}

}  // namespace

TEST_CASE("gemm on the task pool: the OpenMP loop's bits at 1-4 threads, every kernel",
          "[task_pool]") {
  PoolSetting restore(false);
  const std::vector<std::tuple<int64_t, int64_t, int64_t, bool, bool>> shapes = {
      {1990, 48, 1000, false, true},
      {300, 270, 70, true, false},
      {513, 515, 129, false, false},
      {8, 128, 8192, true, false},
      {2048, 128, 512, false, true}};
  std::vector<cpu::GemmKernel> kernels = {cpu::GemmKernel::blas};
  if (cpu::gemm_kernel_supported(cpu::GemmKernel::avx512))
    kernels.push_back(cpu::GemmKernel::avx512);
  for (cpu::GemmKernel kernel : kernels)
    for (const auto& [m, n, k, ta, tb] : shapes) {
      INFO(cpu::gemm_kernel_name(kernel) << ": " << m << " x " << n << " x " << k);
      cpu::set_gemm_kernel(kernel);
      REQUIRE(cpu::gemm_tiling(m, n, k).tiles_m * cpu::gemm_tiling(m, n, k).tiles_n > 1);
      cpu::set_task_pool_enabled(false);
      set_num_threads(2);
      const std::vector<float> loops = product(m, n, k, ta, tb, 70);
      cpu::set_task_pool_enabled(true);
      for (int threads : {1, 2, 3, 4}) {
        set_num_threads(threads);
        const uint32_t before = cpu::task_pool_batches();
        const std::vector<float> pool = product(m, n, k, ta, tb, 70);
        INFO("threads " << threads);
        CHECK(std::memcmp(pool.data(), loops.data(), loops.size() * sizeof(float)) == 0);
        // From 2 threads on the tiles really went to the pool.
        if (threads > 1) CHECK(cpu::task_pool_batches() != before);
      }
    }
}

TEST_CASE("gemm on the task pool: off, the products stay OpenMP loops", "[task_pool]") {
  PoolSetting restore(false);
  set_num_threads(2);
  const uint32_t before = cpu::task_pool_batches();
  const std::vector<float> c = product(1990, 48, 1000, false, true, 80);
  CHECK(cpu::task_pool_batches() == before);
  CHECK(c[0] != 0.0f);
}

TEST_CASE("gemm on the task pool: training gives the OpenMP loops' checkpoint bits",
          "[task_pool]") {
  PoolSetting restore(false);
  // Wide enough that products split into tiles (512 tokens a step, D 128, F 256).
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.d_model = 128, c.d_ff = 256, c.seq = 64;
  c.resolve();
  train::TrainConfig t;
  t.data = test::fortunes_path("computers");
  t.batch = 8, t.steps = 3, t.lr = 3e-3, t.warmup = 2, t.eval_batches = 2, t.seed = 5;
  auto run = [&](bool pool, int threads) {
    cpu::set_task_pool_enabled(pool);
    set_num_threads(threads);
    train::Trainer trainer(c, t, {});
    for (int i = 0; i < 3; ++i) trainer.step();
    return trainer.snapshot();
  };
  const io::Checkpoint loops = run(false, 2);
  for (int threads : {2, 3}) {
    const io::Checkpoint pool = run(true, threads);
    INFO("threads " << threads);
    REQUIRE(pool.params.size() == loops.params.size());
    for (size_t i = 0; i < loops.params.size(); ++i) {
      INFO(loops.params[i].name);
      const size_t bytes = loops.params[i].tensor.nbytes();
      REQUIRE(pool.params[i].tensor.nbytes() == bytes);
      CHECK(std::memcmp(pool.params[i].tensor.raw(), loops.params[i].tensor.raw(), bytes) == 0);
    }
  }
}
