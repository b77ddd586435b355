// MPI communicator tests, run on every rank (mpiexec -n 2 and -n 4). R = world size. Every rank
// computes what every other rank sent (the data is a pure function of rank and index, from fixed
// seeds), so results are checked exactly. Assertions come after the collectives so that a failing
// rank does not leave the others waiting.
#include <sched.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/rng.h"

moe::comm::Communicator& dist_world();  // main.cpp

using namespace moe;
using comm::Communicator;
using comm::ReduceOp;
using comm::Request;

namespace {

// Multiples of 1/4 of modest size: sums in any order are exact in f32.
float value_f32(int rank, int64_t i, uint64_t salt) {
  float v = rng_normal(rng_key(salt, {static_cast<uint64_t>(rank)}), static_cast<uint64_t>(i));
  return std::round(v * 64.0f) / 4.0f + 0.25f;
}
int32_t value_i32(int rank, int64_t i, uint64_t salt) {
  return static_cast<int32_t>(rng_below(rng_key(salt, {static_cast<uint64_t>(rank)}),
                                        static_cast<uint64_t>(i), 200000)) -
         100000;
}
int64_t value_i64(int rank, int64_t i, uint64_t salt) {
  // Past 2^32, so a 32-bit transfer or reduction would show.
  return (int64_t{rank + 1} << 34) + value_i32(rank, i, salt);
}

Tensor f32_rows(int rank, int64_t rows, int64_t width, uint64_t salt) {
  Tensor t = Tensor::empty({rows, width});
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = value_f32(rank, i, salt);
  return t;
}

// Row `row` (of `rows` sent) from `src` to `dst`, element `col`: identifies its origin exactly.
int64_t a2a_value(int src, int dst, int64_t row, int64_t col) {
  return src * 1000000 + dst * 10000 + row * 100 + col + 1;
}

// Uneven split with zeros: rank `src` sends this many rows to `dst`.
int64_t a2a_rows(int src, int dst) { return (src + 2 * dst) % 3; }

}  // namespace

TEST_CASE("comm mpi: world rank, size and name", "[dist]") {
  Communicator& world = dist_world();
  REQUIRE(world.name() == "mpi");
  REQUIRE(world.size() >= 2);
  REQUIRE(world.rank() >= 0);
  REQUIRE(world.rank() < world.size());
  REQUIRE(comm::launched_under_mpi());
  REQUIRE(comm::mpi_thread_level() >= 0);
}

TEST_CASE("comm mpi: all_reduce sum, max and min on f32, i32, i64", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  const int64_t n = 37;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    Tensor f = Tensor::empty({n});
    Tensor i32 = Tensor::empty({n}, DType::i32);
    Tensor i64 = Tensor::empty({n}, DType::i64);
    for (int64_t i = 0; i < n; ++i) {
      f.data<float>()[i] = value_f32(me, i, 11);
      i32.data<int32_t>()[i] = value_i32(me, i, 12);
      i64.data<int64_t>()[i] = value_i64(me, i, 13);
    }
    world.all_reduce(f, op);
    world.all_reduce(i32, op);
    world.all_reduce(i64, op);
    auto combine = [op](auto a, auto b) {
      return op == ReduceOp::sum ? a + b : op == ReduceOp::max ? std::max(a, b) : std::min(a, b);
    };
    int mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      float ef = value_f32(0, i, 11);
      int32_t e32 = value_i32(0, i, 12);
      int64_t e64 = value_i64(0, i, 13);
      for (int r = 1; r < R; ++r) {
        ef = combine(ef, value_f32(r, i, 11));
        e32 = combine(e32, value_i32(r, i, 12));
        e64 = combine(e64, value_i64(r, i, 13));
      }
      mismatches += f.data<float>()[i] != ef;
      mismatches += i32.data<int32_t>()[i] != e32;
      mismatches += i64.data<int64_t>()[i] != e64;
    }
    INFO("op " << comm::reduce_op_name(op));
    CHECK(mismatches == 0);
  }
}

TEST_CASE("comm mpi: all_reduce refuses 16-bit floats on every rank", "[dist]") {
  Communicator& world = dist_world();
  Tensor h = Tensor::zeros({4}, DType::bf16);
  CHECK_THROWS_WITH(world.all_reduce(h, ReduceOp::sum), Catch::Contains("only f32, i32 and i64"));
}

TEST_CASE("comm mpi: all_gather is rank-major", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  Tensor send = f32_rows(me, 3, 5, 21);
  Tensor recv = Tensor::empty({R * 3, 5});
  world.all_gather(send, recv);
  int mismatches = 0;
  for (int r = 0; r < R; ++r)
    for (int64_t i = 0; i < 15; ++i)
      mismatches += recv.data<float>()[r * 15 + i] != value_f32(r, i, 21);
  CHECK(mismatches == 0);
}

TEST_CASE("comm mpi: all_gatherv with uneven and zero counts", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  const int64_t width = 4;
  for (int pattern = 0; pattern < 2; ++pattern) {
    // Pattern 0: rank r contributes r % 3 rows (rank 0 and rank 3 nothing); pattern 1: nobody.
    std::vector<int64_t> counts(R);
    for (int r = 0; r < R; ++r) counts[r] = pattern == 0 ? r % 3 : 0;
    Tensor send = Tensor::empty({counts[me], width}, DType::i32);
    for (int64_t i = 0; i < send.numel(); ++i)
      send.data<int32_t>()[i] = static_cast<int32_t>(me * 1000 + i + 1);
    int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    Tensor recv = Tensor::empty({total, width}, DType::i32);
    world.all_gatherv(send, recv, counts);
    int mismatches = 0;
    int64_t offset = 0;
    for (int r = 0; r < R; ++r) {
      for (int64_t i = 0; i < counts[r] * width; ++i)
        mismatches += recv.data<int32_t>()[offset + i] != r * 1000 + i + 1;
      offset += counts[r] * width;
    }
    INFO("pattern " << pattern);
    CHECK(mismatches == 0);
    CHECK(recv.dim(0) == total);
  }
}

TEST_CASE("comm mpi: all_to_all_v with uneven splits, zero rows and an empty sender", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  const int64_t width = 6;
  for (int pattern = 0; pattern < 2; ++pattern) {
    // Pattern 1: rank 0 sends nothing at all (but still receives).
    auto rows = [&](int src, int dst) -> int64_t {
      if (pattern == 1 && src == 0) return 0;
      return a2a_rows(src, dst) + (pattern == 1 ? 1 : 0);
    };
    std::vector<int64_t> send_counts(R), recv_counts(R);
    for (int r = 0; r < R; ++r) {
      send_counts[r] = rows(me, r);
      recv_counts[r] = rows(r, me);
    }
    int64_t n_send = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
    int64_t n_recv = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
    Tensor send = Tensor::empty({n_send, width}, DType::i64);
    int64_t* s = send.data<int64_t>();
    for (int dst = 0; dst < R; ++dst)
      for (int64_t row = 0; row < send_counts[dst]; ++row)
        for (int64_t c = 0; c < width; ++c) *s++ = a2a_value(me, dst, row, c);
    Tensor recv = Tensor::empty({n_recv, width}, DType::i64);
    recv.zero();
    world.all_to_all_v(send, send_counts, recv, recv_counts);
    int mismatches = 0;
    const int64_t* got = recv.data<int64_t>();
    for (int src = 0; src < R; ++src)
      for (int64_t row = 0; row < recv_counts[src]; ++row)
        for (int64_t c = 0; c < width; ++c) mismatches += *got++ != a2a_value(src, me, row, c);
    INFO("pattern " << pattern << " rank " << me);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("comm mpi: bf16 rows go through all_to_all_v bit for bit", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  const int64_t width = 8;
  auto payload = [&](int src) {  // what rank src sends, to all peers, as bf16
    int64_t n = 0;
    for (int dst = 0; dst < R; ++dst) n += a2a_rows(src, dst) + 1;
    Tensor f = Tensor::empty({n, width});
    for (int64_t i = 0; i < f.numel(); ++i)
      f.data<float>()[i] = rng_normal(rng_key(31, {static_cast<uint64_t>(src)}), i) * 3.0f;
    return f.to(DType::bf16);
  };
  std::vector<int64_t> send_counts(R), recv_counts(R);
  for (int r = 0; r < R; ++r) {
    send_counts[r] = a2a_rows(me, r) + 1;
    recv_counts[r] = a2a_rows(r, me) + 1;
  }
  Tensor send = payload(me);
  Tensor recv = Tensor::zeros(
      {std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0}), width}, DType::bf16);
  world.all_to_all_v(send, send_counts, recv, recv_counts);
  int mismatches = 0;
  int64_t offset = 0;
  for (int src = 0; src < R; ++src) {
    Tensor theirs = payload(src);
    int64_t start = 0;  // where src's rows for me begin in its send buffer
    for (int dst = 0; dst < me; ++dst) start += a2a_rows(src, dst) + 1;
    int64_t n = recv_counts[src] * width;
    mismatches += std::memcmp(recv.half_bits() + offset, theirs.half_bits() + start * width,
                              n * sizeof(uint16_t)) != 0;
    offset += n;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("comm mpi: broadcast from every root", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  for (int root = 0; root < R; ++root) {
    Tensor f = me == root ? f32_rows(root, 4, 3, 41) : Tensor::zeros({4, 3});
    Tensor u = Tensor::empty({9}, DType::u8);
    for (int64_t i = 0; i < 9; ++i)
      u.data<uint8_t>()[i] = static_cast<uint8_t>(me == root ? 7 * i + root + 1 : 0);
    Request rf = world.ibroadcast(f, root);
    world.broadcast(u, root);
    rf.wait();
    Tensor expected = f32_rows(root, 4, 3, 41);
    int mismatches = 0;
    for (int64_t i = 0; i < 12; ++i) mismatches += f.data<float>()[i] != expected.data<float>()[i];
    for (int64_t i = 0; i < 9; ++i) mismatches += u.data<uint8_t>()[i] != 7 * i + root + 1;
    INFO("root " << root);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("comm mpi: send/recv around a ring", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  const int next = (me + 1) % R, prev = (me + R - 1) % R;
  Tensor out = f32_rows(me, 2, 7, 51);
  Tensor in = Tensor::zeros({2, 7});
  Request r = world.irecv(in, prev, 5);
  world.send(out, next, 5);
  r.wait();
  Tensor expected = f32_rows(prev, 2, 7, 51);
  int mismatches = 0;
  for (int64_t i = 0; i < 14; ++i) mismatches += in.data<float>()[i] != expected.data<float>()[i];
  CHECK(mismatches == 0);
}

TEST_CASE("comm mpi: a receive that the message does not fill exactly throws", "[dist]") {
  Communicator& world = dist_world();
  const int me = world.rank();
  if (me == 0) {
    world.send(Tensor::zeros({5}), 1, 9);
    world.send(Tensor::zeros({5}), 1, 10);
  } else if (me == 1) {
    Tensor larger = Tensor::zeros({8});
    CHECK_THROWS_WITH(world.recv(larger, 0, 9), Catch::Contains("received 5 elements"));
    Tensor smaller = Tensor::zeros({3});
    CHECK_THROWS_WITH(world.recv(smaller, 0, 10), Catch::Contains("MPI"));
  }
  world.barrier();
}

TEST_CASE("comm mpi: split into even and odd ranks, collectives inside", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  auto half = world.split(me % 2, me);
  REQUIRE(half != nullptr);
  CHECK(half->size() == (R + 1 - me % 2) / 2);
  CHECK(half->rank() == me / 2);
  Tensor t = Tensor::empty({1}, DType::i32);
  t.data<int32_t>()[0] = me;
  half->all_reduce(t, ReduceOp::sum);
  int expected = 0;
  for (int r = me % 2; r < R; r += 2) expected += r;
  CHECK(t.data<int32_t>()[0] == expected);
  Tensor ranks = Tensor::empty({half->size()}, DType::i32);
  Tensor mine = Tensor::empty({1}, DType::i32);
  mine.data<int32_t>()[0] = me;
  half->all_gather(mine, ranks);
  for (int i = 0; i < half->size(); ++i) CHECK(ranks.data<int32_t>()[i] == me % 2 + 2 * i);

  // A negative color joins no group.
  auto some = world.split(me == 0 ? -1 : 0, me);
  CHECK((some == nullptr) == (me == 0));
  if (some) {
    CHECK(some->size() == R - 1);
    CHECK(some->rank() == me - 1);
    some->barrier();
  }
}

TEST_CASE("comm mpi: data x expert parallel groups", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  const int ep = 2, dp = R / ep;
  REQUIRE(R % ep == 0);
  // Expert-parallel group: consecutive ranks; data-parallel group: same position in each.
  auto ep_group = world.split(me / ep, me);
  auto dp_group = world.split(me % ep, me);
  REQUIRE(ep_group);
  REQUIRE(dp_group);
  CHECK(ep_group->size() == ep);
  CHECK(ep_group->rank() == me % ep);
  CHECK(dp_group->size() == dp);
  CHECK(dp_group->rank() == me / ep);

  // Expert gradients are averaged over data-parallel replicas: sums of world ranks tell groups
  // apart.
  Tensor g = Tensor::empty({3}, DType::i64);
  for (int i = 0; i < 3; ++i) g.data<int64_t>()[i] = me * 10 + i;
  dp_group->all_reduce(g, ReduceOp::sum);
  for (int i = 0; i < 3; ++i) {
    int64_t expected = 0;
    for (int d = 0; d < dp; ++d) expected += (d * ep + me % ep) * 10 + i;
    CHECK(g.data<int64_t>()[i] == expected);
  }

  // Token exchange inside the expert-parallel group.
  const int E = ep_group->size(), e = ep_group->rank();
  std::vector<int64_t> send_counts(E), recv_counts(E);
  for (int r = 0; r < E; ++r) {
    send_counts[r] = a2a_rows(e, r) + 1;
    recv_counts[r] = a2a_rows(r, e) + 1;
  }
  const int64_t width = 3;
  Tensor send = Tensor::empty(
      {std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0}), width}, DType::i64);
  int64_t* s = send.data<int64_t>();
  for (int dst = 0; dst < E; ++dst)
    for (int64_t row = 0; row < send_counts[dst]; ++row)
      for (int64_t c = 0; c < width; ++c) *s++ = a2a_value(me, dst, row, c);
  Tensor recv = Tensor::zeros(
      {std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0}), width}, DType::i64);
  ep_group->all_to_all_v(send, send_counts, recv, recv_counts);
  int mismatches = 0;
  const int64_t* got = recv.data<int64_t>();
  for (int src = 0; src < E; ++src) {
    int src_world = (me / ep) * ep + src;
    for (int64_t row = 0; row < recv_counts[src]; ++row)
      for (int64_t c = 0; c < width; ++c) mismatches += *got++ != a2a_value(src_world, e, row, c);
  }
  CHECK(mismatches == 0);
}

TEST_CASE("comm mpi: split_node groups the ranks of this machine", "[dist]") {
  Communicator& world = dist_world();
  auto node = world.split_node();
  REQUIRE(node);
  // Every rank of these tests runs on one machine.
  CHECK(node->size() == world.size());
  CHECK(node->rank() == world.rank());
  Tensor t = Tensor::empty({1}, DType::i32);
  t.data<int32_t>()[0] = 1;
  node->all_reduce(t, ReduceOp::sum);
  CHECK(t.data<int32_t>()[0] == world.size());
}

TEST_CASE("comm mpi: overlapping non-blocking operations waited in reverse order", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  Tensor a = Tensor::empty({64});
  for (int64_t i = 0; i < 64; ++i) a.data<float>()[i] = value_f32(me, i, 61);
  Tensor gathered = Tensor::empty({R, 5});
  Tensor mine = f32_rows(me, 1, 5, 62);
  std::vector<int64_t> counts(R, 2);
  Tensor send = Tensor::empty({2 * R}, DType::i32);
  for (int dst = 0; dst < R; ++dst)
    for (int j = 0; j < 2; ++j) send.data<int32_t>()[dst * 2 + j] = me * 100 + dst * 10 + j;
  Tensor recv = Tensor::zeros({2 * R}, DType::i32);
  Tensor b = Tensor::empty({3}, DType::i64);
  for (int i = 0; i < 3; ++i) b.data<int64_t>()[i] = me == R - 1 ? 40 + i : -1;

  std::vector<Request> requests;
  requests.push_back(world.iall_reduce(a, ReduceOp::sum));
  requests.push_back(world.iall_gather(mine, gathered));
  requests.push_back(world.iall_to_all_v(send, counts, recv, counts));
  requests.push_back(world.ibroadcast(b, R - 1));
  // Poll the last one, then wait for the rest from the back.
  while (!requests.back().test()) {
  }
  CHECK(requests.back().done());
  for (auto it = requests.rbegin(); it != requests.rend(); ++it) it->wait();

  int mismatches = 0;
  for (int64_t i = 0; i < 64; ++i) {
    float expected = 0;
    for (int r = 0; r < R; ++r) expected += value_f32(r, i, 61);
    mismatches += a.data<float>()[i] != expected;
  }
  for (int r = 0; r < R; ++r)
    for (int64_t i = 0; i < 5; ++i)
      mismatches += gathered.data<float>()[r * 5 + i] != value_f32(r, i, 62);
  for (int src = 0; src < R; ++src)
    for (int j = 0; j < 2; ++j)
      mismatches += recv.data<int32_t>()[src * 2 + j] != src * 100 + me * 10 + j;
  for (int i = 0; i < 3; ++i) mismatches += b.data<int64_t>()[i] != 40 + i;
  CHECK(mismatches == 0);
}

TEST_CASE("comm mpi: a dropped request completes its operation", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size();
  Tensor t = Tensor::empty({2}, DType::i32);
  t.data<int32_t>()[0] = 1;
  t.data<int32_t>()[1] = world.rank();
  {
    Request r = world.iall_reduce(t, ReduceOp::sum);
    Request moved = std::move(r);
    CHECK(r.done());
  }  // ~Request waits
  CHECK(t.data<int32_t>()[0] == R);
  CHECK(t.data<int32_t>()[1] == R * (R - 1) / 2);
}

TEST_CASE("comm mpi: bad arguments throw on the calling rank before communicating", "[dist]") {
  Communicator& world = dist_world();
  const int R = world.size();
  Tensor send = Tensor::zeros({4, 2});
  Tensor recv = Tensor::zeros({4, 2});
  std::vector<int64_t> too_few(R - 1, 0);
  std::vector<int64_t> counts(R, 0);
  counts[0] = 4;
  CHECK_THROWS_WITH(world.all_to_all_v(send, too_few, recv, counts),
                    Catch::Contains("for " + std::to_string(R) + " ranks"));
  Tensor narrow = Tensor::zeros({4, 3});
  CHECK_THROWS_WITH(world.all_to_all_v(send, counts, narrow, counts),
                    Catch::Contains("differ in width"));
  CHECK_THROWS_WITH(world.send(send, R, 0), Catch::Contains("outside the communicator"));
  CHECK_THROWS_WITH(world.broadcast(send, -1), Catch::Contains("outside the communicator"));
  world.barrier();
}

TEST_CASE("comm mpi: check_same_everywhere", "[dist]") {
  Communicator& world = dist_world();
  const int me = world.rank();
  const std::string config = R"({"d_model":64,"experts":8,"top_k":2})";
  CHECK_NOTHROW(world.check_same_everywhere("config", config));
  std::string mine = me == 1 ? R"({"d_model":64,"experts":4,"top_k":2})" : config;
  // Every rank throws, and every message names rank 1 and where the texts part.
  CHECK_THROWS_WITH(world.check_same_everywhere("config", mine),
                    Catch::Contains("config differs between ranks") &&
                        Catch::Contains("rank 1 disagrees with rank 0 at byte 24") &&
                        Catch::Contains("'4,\"top_k\":2}'"));
  // Same length prefix but a longer string on the last rank.
  std::string longer = me == world.size() - 1 ? config + " " : config;
  CHECK_THROWS_WITH(
      world.check_same_everywhere("config", longer),
      Catch::Contains("rank " + std::to_string(world.size() - 1)) && Catch::Contains("<end>"));
}

TEST_CASE(
    "comm mpi: waits sleep only on an oversubscribed node, and both modes give the same "
    "results",
    "[dist]") {
  Communicator& world = dist_world();
  const comm::WaitMode chosen = comm::wait_mode();
  if (const char* env = std::getenv("MOE_MPI_WAIT")) {
    REQUIRE(comm::wait_mode_name(chosen) == std::string(env));
  } else {
    auto node = world.split_node();
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    REQUIRE(sched_getaffinity(0, sizeof cpus, &cpus) == 0);
    INFO(node->size() << " ranks on this node, " << CPU_COUNT(&cpus) << " usable cores");
    REQUIRE(chosen ==
            (node->size() > CPU_COUNT(&cpus) ? comm::WaitMode::sleep : comm::WaitMode::spin));
  }
  const int R = world.size();
  for (comm::WaitMode mode : {comm::WaitMode::spin, comm::WaitMode::sleep}) {
    comm::set_wait_mode(mode);
    // 1 MiB per rank: large enough for MPICH's pipelined shared-memory path.
    const int64_t n = 262144;
    Tensor sum = Tensor::empty({n});
    for (int64_t i = 0; i < n; ++i) sum.data<float>()[i] = float(world.rank() + 1) * float(i % 7);
    world.all_reduce(sum, ReduceOp::sum);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += sum.data<float>()[i] != float(R * (R + 1) / 2 * (i % 7));
    REQUIRE(wrong == 0);
    Tensor send = Tensor::empty({R * 1000, 4}, DType::i32),
           recv = Tensor::empty({R * 1000, 4}, DType::i32);
    for (int64_t i = 0; i < send.numel(); ++i)
      send.data<int32_t>()[i] = world.rank() * 1000000 + static_cast<int32_t>(i);
    std::vector<int64_t> counts(static_cast<size_t>(R), 1000);
    world.all_to_all_v(send, counts, recv, counts);
    for (int s = 0; s < R; ++s)
      REQUIRE(recv.data<int32_t>()[s * 4000] == s * 1000000 + world.rank() * 4000);
  }
  comm::set_wait_mode(chosen);
}
