// CommScheduler over MPI (mpiexec -n 2 and -n 4; R = world size). Checks that scheduled
// allreduce equals the direct one bit for bit, that all-to-alls interleaved with many allreduce
// micro-ops arrive intact while one rank is delayed, and that every rank issued the same pieces in
// the same order (the agreement rule of scheduler.h), whatever the timing. Assertions come after
// the collectives so that a failing rank does not leave the others waiting.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "moe/comm/scheduler.h"
#include "moe/rng.h"

moe::comm::Communicator& dist_world();  // main.cpp

using namespace moe;
using comm::CommScheduler;
using comm::ExecutedPiece;
using comm::ReduceOp;
using comm::SchedulerMode;
using comm::Ticket;

namespace {

// General floats (not exactly summable), different on every rank.
Tensor random_f32(int rank, int64_t n, uint64_t salt) {
  Tensor t = Tensor::empty({n});
  for (int64_t i = 0; i < n; ++i)
    t.data<float>()[i] =
        rng_normal(rng_key(salt, {static_cast<uint64_t>(rank)}), static_cast<uint64_t>(i));
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Row `row` from `src` to `dst`, element `col`, in round `round`: identifies its origin exactly.
int64_t a2a_value(int round, int src, int dst, int64_t row, int64_t col) {
  return round * 100000000 + src * 1000000 + dst * 10000 + row * 100 + col + 1;
}
int64_t a2a_rows(int round, int src, int dst) { return (src + 2 * dst + round) % 3; }

struct Exchange {
  std::vector<int64_t> send_counts, recv_counts;
  Tensor send, recv;
};

Exchange make_exchange(int round, int me, int R, int64_t width) {
  Exchange x;
  for (int r = 0; r < R; ++r) {
    x.send_counts.push_back(a2a_rows(round, me, r));
    x.recv_counts.push_back(a2a_rows(round, r, me));
  }
  x.send = Tensor::empty(
      {std::accumulate(x.send_counts.begin(), x.send_counts.end(), int64_t{0}), width}, DType::i64);
  x.recv = Tensor::zeros(
      {std::accumulate(x.recv_counts.begin(), x.recv_counts.end(), int64_t{0}), width}, DType::i64);
  int64_t* s = x.send.data<int64_t>();
  for (int dst = 0; dst < R; ++dst)
    for (int64_t row = 0; row < x.send_counts[dst]; ++row)
      for (int64_t c = 0; c < width; ++c) *s++ = a2a_value(round, me, dst, row, c);
  return x;
}

int exchange_mismatches(const Exchange& x, int round, int me, int R, int64_t width) {
  int mismatches = 0;
  const int64_t* got = x.recv.data<int64_t>();
  for (int src = 0; src < R; ++src)
    for (int64_t row = 0; row < x.recv_counts[src]; ++row)
      for (int64_t c = 0; c < width; ++c) mismatches += *got++ != a2a_value(round, src, me, row, c);
  return mismatches;
}

// True when every rank's execution log lists the same pieces (by sequence number) in the same
// order.
bool same_order_everywhere(comm::Communicator& world, const std::vector<ExecutedPiece>& log) {
  const int64_t n = static_cast<int64_t>(log.size());
  Tensor mine = Tensor::empty({n + 1}, DType::i64);
  mine.data<int64_t>()[0] = n;
  for (int64_t i = 0; i < n; ++i)
    mine.data<int64_t>()[i + 1] = static_cast<int64_t>(log[i].sequence);
  Tensor lengths = Tensor::empty({world.size()}, DType::i64);
  Tensor length = Tensor::empty({1}, DType::i64);
  length.data<int64_t>()[0] = n + 1;
  world.all_gather(length, lengths);
  std::vector<int64_t> counts(lengths.data<int64_t>(), lengths.data<int64_t>() + world.size());
  Tensor all =
      Tensor::empty({std::accumulate(counts.begin(), counts.end(), int64_t{0})}, DType::i64);
  world.all_gatherv(mine, all, counts);
  const int64_t* p = all.data<int64_t>();
  for (int r = 1; r < world.size(); ++r)
    if (counts[r] != counts[0] ||
        !std::equal(p, p + counts[0],
                    p + std::accumulate(counts.begin(), counts.begin() + r, int64_t{0})))
      return false;
  return true;
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

}  // namespace

TEST_CASE("comm scheduler mpi: allreduce equals the direct allreduce bit for bit", "[dist]") {
  comm::Communicator& world = dist_world();
  const int me = world.rank();
  for (SchedulerMode mode : {SchedulerMode::off, SchedulerMode::priority}) {
    // 1 KiB micro-ops: tensors of 1, 2.5 and 10 micro-ops and 3 elements.
    CommScheduler scheduler(world, 1024, mode);
    std::vector<Tensor> scheduled, direct;
    std::vector<Ticket> tickets;
    for (int64_t n : {256, 640, 2560 + 3}) {
      scheduled.push_back(random_f32(me, n, 100 + n));
      direct.push_back(scheduled.back().clone());
    }
    for (Tensor& t : scheduled) tickets.push_back(scheduler.all_reduce(t, ReduceOp::sum));
    for (Tensor& t : direct) world.all_reduce(t, ReduceOp::sum);  // concurrently, on world
    for (Ticket t : tickets) scheduler.wait(t);
    // max as well: order-free, so it must match whatever the algorithm.
    Tensor maxed = random_f32(me, 1000, 7), maxed_direct = maxed.clone();
    scheduler.wait(scheduler.all_reduce(maxed, ReduceOp::max));
    world.all_reduce(maxed_direct, ReduceOp::max);

    int differing = 0;
    for (size_t i = 0; i < scheduled.size(); ++i) differing += !same_bytes(scheduled[i], direct[i]);
    INFO("mode " << comm::scheduler_mode_name(mode) << " rank " << me);
    CHECK(differing == 0);
    CHECK(same_bytes(maxed, maxed_direct));
    auto stats = scheduler.stats();
    CHECK(stats.all_reduce.ops == 4);
    CHECK(stats.all_reduce.pieces == (mode == SchedulerMode::off ? 4 : 1 + 3 + 11 + 4));
  }
}

TEST_CASE("comm scheduler mpi: all-to-all amid micro-ops with one rank delayed", "[dist]") {
  comm::Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  const int64_t width = 5;
  for (SchedulerMode mode : {SchedulerMode::off, SchedulerMode::priority}) {
    CommScheduler scheduler(world, 512, mode);  // 128 f32 per micro-op
    int a2a_mismatches = 0, reduce_mismatches = 0, jumped = 0;
    for (int round = 0; round < 3; ++round) {
      const int delayed = round % R;
      // Integer-valued gradients: sums exact, so the expected result is known on every rank.
      std::vector<Tensor> grads;
      for (int g = 0; g < 3; ++g) {
        Tensor t = Tensor::empty({600 + 37 * g}, DType::i32);
        for (int64_t i = 0; i < t.numel(); ++i)
          t.data<int32_t>()[i] = static_cast<int32_t>((me + 1) * (i + g + round));
        grads.push_back(std::move(t));
      }
      Exchange first = make_exchange(2 * round, me, R, width);
      Exchange second = make_exchange(2 * round + 1, me, R, width);
      std::vector<Ticket> tickets;
      tickets.push_back(scheduler.all_reduce(grads[0], ReduceOp::sum));  // 5 micro-ops
      tickets.push_back(scheduler.all_reduce(grads[1], ReduceOp::sum));  // 5
      if (me == delayed) sleep_ms(30);
      Ticket a2a1 =
          scheduler.all_to_all_v(first.send, first.send_counts, first.recv, first.recv_counts);
      tickets.push_back(scheduler.all_reduce(grads[2], ReduceOp::sum));  // 6
      if (me == (delayed + 1) % R) sleep_ms(20);
      Ticket a2a2 =
          scheduler.all_to_all_v(second.send, second.send_counts, second.recv, second.recv_counts);
      scheduler.wait(a2a1);  // the forward pass needs the tokens now
      scheduler.wait(a2a2);
      for (Ticket t : tickets) scheduler.wait(t);
      a2a_mismatches += exchange_mismatches(first, 2 * round, me, R, width);
      a2a_mismatches += exchange_mismatches(second, 2 * round + 1, me, R, width);
      const int64_t rank_sum = int64_t{R} * (R + 1) / 2;
      for (int g = 0; g < 3; ++g)
        for (int64_t i = 0; i < grads[g].numel(); ++i)
          reduce_mismatches += grads[g].data<int32_t>()[i] != rank_sum * (i + g + round);
    }
    std::vector<ExecutedPiece> log = scheduler.execution_log();
    // An all-to-all issued before a piece submitted earlier than it: priority at work.
    for (size_t i = 0; i < log.size(); ++i)
      for (size_t j = i + 1; j < log.size(); ++j) jumped += log[j].sequence < log[i].sequence;
    const bool same_order = same_order_everywhere(world, log);
    INFO("mode " << comm::scheduler_mode_name(mode) << " rank " << me << " overtakes " << jumped);
    CHECK(a2a_mismatches == 0);
    CHECK(reduce_mismatches == 0);
    CHECK(same_order);
    CHECK(log.size() == (mode == SchedulerMode::off ? 3 * 5 : 3 * (5 + 5 + 6 + 2)));
    if (mode == SchedulerMode::off) CHECK(jumped == 0);
  }
}

TEST_CASE("comm scheduler mpi: a batch submitted while paused is issued all-to-all first",
          "[dist]") {
  comm::Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  CommScheduler scheduler(world, 256, SchedulerMode::priority);  // 64 f32 per micro-op
  Tensor grads = random_f32(me, 64 * 5, 31), direct = grads.clone();
  Exchange x = make_exchange(9, me, R, 3);
  scheduler.pause();
  Ticket reduce = scheduler.all_reduce(grads, ReduceOp::sum);
  if (me == R - 1) sleep_ms(30);  // the others' threads wait for this rank to resume
  Ticket a2a = scheduler.all_to_all_v(x.send, x.send_counts, x.recv, x.recv_counts);
  scheduler.resume();
  scheduler.wait(reduce);
  scheduler.wait(a2a);
  world.all_reduce(direct, ReduceOp::sum);
  std::vector<ExecutedPiece> log = scheduler.execution_log();
  std::vector<uint64_t> order;
  for (const ExecutedPiece& p : log) order.push_back(p.sequence);
  const bool same_order = same_order_everywhere(world, log);
  CHECK(order == std::vector<uint64_t>{5, 0, 1, 2, 3, 4});
  CHECK(same_order);
  CHECK(exchange_mismatches(x, 9, me, R, 3) == 0);
  CHECK(same_bytes(grads, direct));
}

TEST_CASE("comm scheduler mpi: a failing all-to-all is reported on every rank, then work goes on",
          "[dist]") {
  comm::Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  CommScheduler scheduler(world, 512, SchedulerMode::priority);
  Exchange x = make_exchange(3, me, R, 2);
  std::vector<int64_t> too_few(x.send_counts.begin(), x.send_counts.end() - 1);
  Ticket bad = scheduler.all_to_all_v(x.send, too_few, x.recv, x.recv_counts);
  Tensor grads = random_f32(me, 1000, 41), direct = grads.clone();
  Ticket good = scheduler.all_reduce(grads, ReduceOp::sum);
  bool threw = false;
  try {
    scheduler.wait(bad);
  } catch (const Error& e) {
    threw = std::string(e.what()).find("send counts") != std::string::npos;
  }
  scheduler.wait(good);
  world.all_reduce(direct, ReduceOp::sum);
  CHECK(threw);
  CHECK(same_bytes(grads, direct));
}
