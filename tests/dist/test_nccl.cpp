// [cuda] NCCL communicator tests, run by mpiexec on every rank (ctest entries cuda_nccl_np2/np4,
// which run only the [nccl] cases; the plain dist runs leave them out). Each rank uses the GPU of
// its local rank. Without a usable GPU every case prints "[cuda] skipped:" and ctest reports the
// entry as skipped. Results are compared exactly with what the MPI communicator computes.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/cuda.h"
#include "moe/train/trainer.h"
#include "support/cuda.h"
#include "support/models.h"
#include "support/run.h"
#ifdef MOE_HAVE_CUDA
#include "moe/comm/nccl.h"
#endif

moe::comm::Communicator& dist_world();  // main.cpp

using namespace moe;
using comm::Communicator;
using comm::ReduceOp;

#ifdef MOE_HAVE_CUDA
namespace {

Device my_gpu() {
  static const int device = [] {
    std::unique_ptr<Communicator> node = dist_world().split_node();
    return cuda::device_for_local_rank(node->rank());
  }();
  return {Device::cuda, device};
}

std::unique_ptr<Communicator> make_nccl_world() {
  return comm::make_nccl(dist_world(), comm::NcclOptions{my_gpu().index, 0});
}

// The trainer tests' model and run: small mixtral, batches of the real corpus.
ModelConfig nccl_model() {
  ModelConfig model = test::small_model_config(Arch::mixtral);
  model.resolve();
  return model;
}
train::TrainConfig nccl_train_config(int64_t steps) {
  train::TrainConfig config;
  config.data = test::fortunes_path("linux");
  config.batch = 8;
  config.steps = steps;
  config.warmup = 2;
  config.eval_batches = 1;
  config.seed = 11;
  return config;
}

int ranks_on_node() {
  static const int ranks = dist_world().split_node()->size();  // every rank gets here together
  return ranks;
}

}  // namespace

// NCCL needs a GPU per rank: on a node with fewer GPUs than ranks a case is skipped by name (the
// refusal itself is the last case below).
#define MOE_REQUIRE_GPU_PER_RANK()                                                            \
  do {                                                                                        \
    MOE_REQUIRE_CUDA_DEVICE();                                                                \
    if (ranks_on_node() > cuda::device_count()) {                                             \
      std::cout << "[cuda] skipped: " << ranks_on_node() << " ranks on this node need a GPU " \
                << "each, " << cuda::device_count() << " usable\n";                           \
      return;                                                                                 \
    }                                                                                         \
  } while (0)

namespace {

// Quarter multiples: sums in any order are exact.
Tensor rows_of(int rank, int64_t rows, int64_t width, float salt) {
  std::vector<float> v(static_cast<size_t>(rows * width));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = std::round(std::sin(salt + rank * 7.0f + static_cast<float>(i)) * 64.0f) / 4.0f;
  return Tensor::from_vector({rows, width}, v);
}

}  // namespace

TEST_CASE("nccl: all-reduce, all-gather and broadcast equal MPI's", "[nccl][cuda]") {
  MOE_REQUIRE_GPU_PER_RANK();
  Communicator& world = dist_world();
  auto nccl = make_nccl_world();
  REQUIRE(nccl->rank() == world.rank());
  REQUIRE(nccl->size() == world.size());
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    Tensor host = rows_of(world.rank(), 33, 5, 1.0f);
    Tensor dev = host.to(my_gpu());
    world.all_reduce(host, op);
    nccl->all_reduce(dev, op);
    REQUIRE(dev.to_vector() == host.to_vector());
  }
  Tensor send = rows_of(world.rank(), 4, 3, 2.0f);
  Tensor want = Tensor::empty({4 * world.size(), 3}),
         got = Tensor::empty({4 * world.size(), 3}, DType::f32, my_gpu());
  world.all_gather(send, want);
  nccl->all_gather(send.to(my_gpu()), got);
  REQUIRE(got.to_vector() == want.to_vector());
  Tensor b = rows_of(world.rank(), 7, 2, 3.0f), bd = b.to(my_gpu());
  world.broadcast(b, world.size() - 1);
  nccl->broadcast(bd, world.size() - 1);
  REQUIRE(bd.to_vector() == b.to_vector());
}

TEST_CASE("nccl: uneven all-to-all-v with zero counts equals MPI's", "[nccl][cuda]") {
  MOE_REQUIRE_GPU_PER_RANK();
  Communicator& world = dist_world();
  auto nccl = make_nccl_world();
  const int R = world.size(), me = world.rank();
  std::vector<int64_t> send_counts(R), recv_counts(R);
  int64_t send_rows = 0, recv_rows = 0;
  for (int p = 0; p < R; ++p) {
    send_counts[p] = (me + 2 * p) % 3;
    recv_counts[p] = (p + 2 * me) % 3;
    send_rows += send_counts[p];
    recv_rows += recv_counts[p];
  }
  Tensor send = rows_of(me, send_rows, 6, 4.0f);
  Tensor want = Tensor::empty({recv_rows, 6});
  Tensor got = Tensor::empty({recv_rows, 6}, DType::f32, my_gpu());
  world.all_to_all_v(send, send_counts, want, recv_counts);
  nccl->all_to_all_v(send.to(my_gpu()), send_counts, got, recv_counts);
  REQUIRE(got.to_vector() == want.to_vector());
  // Host tensors are staged through the device and give the same result.
  Tensor got_host = Tensor::empty({recv_rows, 6});
  nccl->all_to_all_v(send, send_counts, got_host, recv_counts);
  REQUIRE(got_host.to_vector() == want.to_vector());
}

TEST_CASE("nccl: send/recv ring, split and start-up checks", "[nccl][cuda]") {
  MOE_REQUIRE_GPU_PER_RANK();
  Communicator& world = dist_world();
  auto nccl = make_nccl_world();
  const int R = world.size(), me = world.rank();
  Tensor out = rows_of(me, 3, 3, 5.0f).to(my_gpu());
  Tensor in = Tensor::empty({3, 3}, DType::f32, my_gpu());
  comm::Request s = nccl->isend(out, (me + 1) % R, 0);
  comm::Request r = nccl->irecv(in, (me + R - 1) % R, 0);
  s.wait();
  r.wait();
  REQUIRE(in.to_vector() == rows_of((me + R - 1) % R, 3, 3, 5.0f).to_vector());
  auto half = nccl->split(me % 2, me);
  REQUIRE(half);
  REQUIRE(half->size() == (R + 1 - me % 2) / 2);
  Tensor one = Tensor::from_vector({1}, std::vector<float>{1.0f}).to(my_gpu());
  half->all_reduce(one, ReduceOp::sum);
  REQUIRE(one.to_vector()[0] == static_cast<float>(half->size()));
  auto urgent = nccl->split_with_priority(0, me, -1);  // the expert all-to-all's stream
  REQUIRE(urgent->size() == R);
  Tensor ones = Tensor::from_vector({2}, std::vector<float>{1.0f, 2.0f}).to(my_gpu());
  urgent->all_reduce(ones, ReduceOp::sum);
  REQUIRE(ones.to_vector() == std::vector<float>{float(R), 2.0f * float(R)});
  nccl->check_same_everywhere("nccl test", "same");
  REQUIRE_THROWS_WITH(nccl->check_same_everywhere("nccl test", me == 0 ? "a" : "b"),
                      Catch::Contains("differs"));
  nccl->barrier();
}

// Training over NCCL, each rank on its GPU, against the same layout trained over MPI on the CPU:
// pure data parallel, data x expert parallel, and the hierarchical all-to-all with the priority
// scheduler's micro-ops. Tolerances as for one GPU against the CPU (test_cuda_model.cpp).
TEST_CASE("nccl: multi-GPU training follows the MPI run on the CPU", "[nccl][cuda]") {
  MOE_REQUIRE_GPU_PER_RANK();
  Communicator& world = dist_world();
  auto nccl = make_nccl_world();
  const int R = world.size();
  const ModelConfig model = nccl_model();
  train::TrainConfig base = nccl_train_config(4);
  std::vector<std::pair<std::string, train::TrainConfig>> layouts;
  layouts.emplace_back("data parallel", base);
  base.ep = R;
  layouts.emplace_back("expert parallel", base);
  base.a2a = comm::A2AAlgorithm::hierarchical;
  base.ranks_per_node = R >= 4 ? 2 : 1;
  base.comm_scheduler = comm::SchedulerMode::priority;
  base.partition_mb = 0.004;
  layouts.emplace_back("hierarchical a2a, priority scheduler", base);
  for (const auto& [name, config] : layouts) {
    INFO(name);
    train::Trainer gpu(model, config, {}, nccl.get());
    gpu.to_device(my_gpu());
    train::Trainer cpu(model, config, {}, &world);
    for (int step = 0; step < config.steps; ++step) {
      INFO("step " << step + 1);
      const train::StepStats a = gpu.step(), b = cpu.step();
      CHECK(a.forward.loss == Approx(b.forward.loss).epsilon(1e-3));
      CHECK(a.forward.aux_loss == Approx(b.forward.aux_loss).epsilon(1e-3));
      CHECK(a.grad_norm == Approx(b.grad_norm).epsilon(1e-2));
    }
    double worst = 0;
    for (Param* p : gpu.params().all()) {
      const std::vector<float> x = p->value.to_vector(),
                               y = cpu.params().at(p->name).value.to_vector();
      worst = std::max(worst, test::normalised_error(x, y));
    }
    CHECK(worst < 1e-3);
    REQUIRE(gpu.model().device() == my_gpu());  // it did train on the GPU
  }
}

TEST_CASE("nccl: what multi-GPU training refuses, it names", "[nccl][cuda]") {
  MOE_REQUIRE_GPU_PER_RANK();
  Communicator& world = dist_world();
  auto nccl = make_nccl_world();
  const ModelConfig model = nccl_model();
  train::TrainConfig config = nccl_train_config(2);
  train::Trainer over_mpi(model, config, {}, &world);
  REQUIRE_THROWS_WITH(over_mpi.to_device(my_gpu()), Catch::Contains("needs an NCCL communicator"));
  config.shard_embedding = true;
  train::Trainer sharded(model, config, {}, nccl.get());
  REQUIRE_THROWS_WITH(sharded.to_device(my_gpu()), Catch::Contains("--shard-embedding"));
}

TEST_CASE("nccl: more ranks than GPUs on a node are refused on every rank, by name",
          "[nccl][cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  if (ranks_on_node() <= cuda::device_count()) {
    std::cout << "[cuda] skipped: every rank has a GPU of its own here (" << ranks_on_node()
              << " ranks on this node, " << cuda::device_count() << " GPUs)\n";
    return;
  }
  REQUIRE_THROWS_WITH(make_nccl_world(),
                      Catch::StartsWith("NCCL needs a GPU of its own for every rank: on this "
                                        "node, local ranks "));
  dist_world().barrier();  // nothing was left half-made: the MPI world still works
}

#else
TEST_CASE("nccl: communicator tests", "[nccl][cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  FAIL("a CUDA device is usable but this build has no CUDA backend");
}
#endif
