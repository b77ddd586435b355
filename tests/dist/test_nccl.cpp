// [cuda] NCCL communicator tests, run by mpiexec on every rank (ctest entries cuda_nccl_np2/np4,
// which run only the [nccl] cases; the plain dist runs leave them out). Each rank uses the GPU of
// its local rank. Without a usable GPU every case prints "[cuda] skipped:" and ctest reports the
// entry as skipped. Results are compared exactly with what the MPI communicator computes.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/cuda.h"
#include "support/cuda.h"
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

// Quarter multiples: sums in any order are exact.
Tensor rows_of(int rank, int64_t rows, int64_t width, float salt) {
  std::vector<float> v(static_cast<size_t>(rows * width));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = std::round(std::sin(salt + rank * 7.0f + static_cast<float>(i)) * 64.0f) / 4.0f;
  return Tensor::from_vector({rows, width}, v);
}

}  // namespace

TEST_CASE("nccl: all-reduce, all-gather and broadcast equal MPI's", "[nccl][cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
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
  MOE_REQUIRE_CUDA_DEVICE();
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
  MOE_REQUIRE_CUDA_DEVICE();
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
  nccl->check_same_everywhere("nccl test", "same");
  REQUIRE_THROWS_WITH(nccl->check_same_everywhere("nccl test", me == 0 ? "a" : "b"),
                      Catch::Contains("differs"));
  nccl->barrier();
}

#else
TEST_CASE("nccl: communicator tests", "[nccl][cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  FAIL("a CUDA device is usable but this build has no CUDA backend");
}
#endif
