// CommScheduler on one rank: a probe communicator wraps the local one to record what the
// communication thread issues (buffer address and length of every f32 allreduce), to hold a
// micro-op in flight and to inject failures, so that micro-op cutting, the priority order and
// error delivery are checked exactly, without timing assumptions.
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "moe/comm/all_to_all.h"
#include "moe/comm/local.h"
#include "moe/comm/scheduler.h"
#include "moe/rng.h"

using namespace moe;
using comm::CommOpKind;
using comm::CommScheduler;
using comm::ExecutedPiece;
using comm::ReduceOp;
using comm::Request;
using comm::SchedulerMode;
using comm::Ticket;

namespace {

// Shared by a ProbeComm and its split()s (the scheduler works on a duplicate).
struct Probe {
  std::mutex mutex;
  std::condition_variable cv;
  struct Reduce {
    const void* data;
    int64_t numel;
  };
  std::vector<Reduce> reduces;  // f32 allreduces (the agreement is i64 and not recorded)
  bool hold_next = false;       // the next f32 allreduce blocks until release()
  bool holding = false;
  int fail_reduce_index = -1;  // this f32 allreduce (0-based) throws
  int delay_ms = 0;            // every f32 allreduce takes this long

  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    hold_next = false;
    cv.notify_all();
  }
  bool wait_holding() {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, std::chrono::seconds(5), [&] { return holding; });
  }
};

class ProbeComm final : public comm::Communicator {
 public:
  explicit ProbeComm(std::shared_ptr<Probe> probe) : probe_(std::move(probe)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "probe"; }
  std::unique_ptr<Communicator> split(int color, int) override {
    if (color < 0) return nullptr;
    return std::make_unique<ProbeComm>(probe_);
  }
  std::unique_ptr<Communicator> split_node() override {
    return std::make_unique<ProbeComm>(probe_);
  }

  Request iall_reduce(Tensor& buf, ReduceOp op) override {
    if (buf.dtype() == DType::f32) {
      std::unique_lock<std::mutex> lock(probe_->mutex);
      int index = static_cast<int>(probe_->reduces.size());
      probe_->reduces.push_back({buf.raw(), buf.numel()});
      if (probe_->hold_next) {
        probe_->holding = true;
        probe_->cv.notify_all();
        probe_->cv.wait(lock, [&] { return !probe_->hold_next; });
        probe_->holding = false;
      }
      MOE_CHECK(index != probe_->fail_reduce_index, "probe: injected failure of allreduce ", index);
      if (probe_->delay_ms > 0) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(probe_->delay_ms));
      }
    }
    return local_.iall_reduce(buf, op);
  }
  Request iall_gather(const Tensor& send, Tensor& recv) override {
    return local_.iall_gather(send, recv);
  }
  Request iall_gatherv(const Tensor& send, Tensor& recv, std::span<const int64_t> counts) override {
    return local_.iall_gatherv(send, recv, counts);
  }
  Request iall_to_all_v(const Tensor& send, std::span<const int64_t> send_counts, Tensor& recv,
                        std::span<const int64_t> recv_counts) override {
    return local_.iall_to_all_v(send, send_counts, recv, recv_counts);
  }
  Request ibroadcast(Tensor& buf, int root) override { return local_.ibroadcast(buf, root); }
  Request isend(const Tensor& buf, int peer, int tag) override {
    return local_.isend(buf, peer, tag);
  }
  Request irecv(Tensor& buf, int peer, int tag) override { return local_.irecv(buf, peer, tag); }
  void barrier() override {}

 private:
  std::shared_ptr<Probe> probe_;
  comm::LocalCommunicator local_;
};

Tensor random_f32(int64_t rows, int64_t width, uint64_t salt) {
  Tensor t = Tensor::empty({rows, width});
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = rng_normal(rng_key(salt, {}), static_cast<uint64_t>(i)) + 0.5f;
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// "A0 A1 C0 ..." with letters by ticket id (A = ticket 0) and the chunk index.
std::string order_of(const std::vector<ExecutedPiece>& log) {
  std::string s;
  for (const ExecutedPiece& p : log) {
    if (!s.empty()) s += ' ';
    s += static_cast<char>('A' + p.ticket);
    s += std::to_string(p.chunk);
  }
  return s;
}

}  // namespace

TEST_CASE("comm scheduler: results equal direct calls in both modes", "[comm][scheduler]") {
  for (SchedulerMode mode : {SchedulerMode::off, SchedulerMode::priority}) {
    auto world = comm::make_local();
    CommScheduler scheduler(*world, 100, mode);
    Tensor grads = random_f32(13, 7, 1), direct_grads = grads.clone();
    Tensor send = random_f32(6, 5, 2);
    Tensor recv = Tensor::zeros({6, 5}), direct_recv = Tensor::zeros({6, 5});
    Ticket reduce = scheduler.all_reduce(grads, ReduceOp::sum);
    Ticket a2a = scheduler.all_to_all_v(send, {6}, recv, {6});
    scheduler.wait(a2a);
    scheduler.wait(reduce);
    world->all_reduce(direct_grads, ReduceOp::sum);
    world->all_to_all_v(send, std::vector<int64_t>{6}, direct_recv, std::vector<int64_t>{6});
    INFO("mode " << comm::scheduler_mode_name(mode));
    CHECK(same_bytes(grads, direct_grads));
    CHECK(same_bytes(recv, direct_recv));
    CHECK(same_bytes(recv, send));
    CHECK(scheduler.done(reduce));
    CHECK(scheduler.done(a2a));
  }
}

TEST_CASE("comm scheduler: micro-ops are element-aligned views covering the tensor",
          "[comm][scheduler]") {
  struct Case {
    DType dtype;
    int64_t numel;
    size_t partition_bytes;
    int64_t per_chunk;  // expected elements per micro-op
  };
  // 37 f32 in 40-byte parts: 10+10+10+7; 6 bytes is less than... 1 element per part is the floor;
  // 41 bytes rounds down to whole elements; a partition larger than the tensor gives one part.
  for (Case c :
       {Case{DType::f32, 37, 40, 10}, Case{DType::f32, 37, 41, 10}, Case{DType::f32, 5, 3, 1},
        Case{DType::f32, 37, 4096, 37}, Case{DType::i64, 9, 16, 2}}) {
    auto probe = std::make_shared<Probe>();
    ProbeComm world(probe);
    CommScheduler scheduler(world, c.partition_bytes, SchedulerMode::priority);
    Tensor buf = Tensor::zeros({c.numel}, c.dtype);
    scheduler.wait(scheduler.all_reduce(buf, ReduceOp::sum));
    const int64_t chunks = (c.numel + c.per_chunk - 1) / c.per_chunk;
    std::vector<ExecutedPiece> log = scheduler.execution_log();
    INFO("numel " << c.numel << " partition " << c.partition_bytes);
    REQUIRE(static_cast<int64_t>(log.size()) == chunks);
    for (int64_t i = 0; i < chunks; ++i) {
      CHECK(log[i].chunk == i);
      CHECK(log[i].chunks == chunks);
      CHECK(log[i].sequence == static_cast<uint64_t>(i));
    }
    auto stats = scheduler.stats();
    CHECK(stats.all_reduce.ops == 1);
    CHECK(stats.all_reduce.pieces == chunks);
    CHECK(stats.all_reduce.bytes == static_cast<int64_t>(buf.nbytes()));
    CHECK(stats.agreements == chunks);
    if (c.dtype == DType::f32) {  // the probe records f32 reductions: exact address and length
      REQUIRE(static_cast<int64_t>(probe->reduces.size()) == chunks);
      for (int64_t i = 0; i < chunks; ++i) {
        const auto* base = static_cast<const std::byte*>(buf.raw());
        CHECK(probe->reduces[i].data == base + i * c.per_chunk * 4);
        CHECK(probe->reduces[i].numel == std::min(c.per_chunk, c.numel - i * c.per_chunk));
      }
    }
  }
}

TEST_CASE("comm scheduler: off mode issues whole tensors first in first out", "[comm][scheduler]") {
  auto probe = std::make_shared<Probe>();
  ProbeComm world(probe);
  CommScheduler scheduler(world, 8, SchedulerMode::off);
  Tensor a = Tensor::zeros({10}), b = Tensor::zeros({3, 4});
  Tensor send = random_f32(2, 3, 3), recv = Tensor::zeros({2, 3});
  scheduler.pause();
  scheduler.all_reduce(a, ReduceOp::sum);
  scheduler.all_to_all_v(send, {2}, recv, {2});
  scheduler.all_reduce(b, ReduceOp::max);
  scheduler.resume();
  scheduler.wait_all();
  CHECK(order_of(scheduler.execution_log()) == "A0 B0 C0");
  REQUIRE(probe->reduces.size() == 2);
  CHECK(probe->reduces[0].numel == 10);
  CHECK(probe->reduces[1].numel == 12);
  CHECK(scheduler.stats().agreements == 0);
  CHECK(same_bytes(send, recv));
}

TEST_CASE("comm scheduler: all-to-all goes before queued allreduce micro-ops",
          "[comm][scheduler]") {
  auto world = comm::make_local();
  CommScheduler scheduler(*world, 16, SchedulerMode::priority);  // 4 f32 per micro-op
  Tensor a = Tensor::zeros({16}), b = Tensor::zeros({10}), d = Tensor::zeros({5});
  Tensor send1 = random_f32(3, 2, 4), recv1 = Tensor::zeros({3, 2});
  Tensor send2 = random_f32(1, 2, 5), recv2 = Tensor::zeros({1, 2});
  scheduler.pause();
  scheduler.all_reduce(a, ReduceOp::sum);          // A: 4 micro-ops
  scheduler.all_reduce(b, ReduceOp::sum);          // B: 3
  scheduler.all_to_all_v(send1, {3}, recv1, {3});  // C
  scheduler.all_reduce(d, ReduceOp::sum);          // D: 2
  scheduler.all_to_all_v(send2, {1}, recv2, {1});  // E
  scheduler.resume();
  scheduler.wait_all();
  CHECK(order_of(scheduler.execution_log()) == "C0 E0 A0 A1 A2 A3 B0 B1 B2 D0 D1");
  CHECK(same_bytes(send1, recv1));
  CHECK(same_bytes(send2, recv2));
  auto stats = scheduler.stats();
  CHECK(stats.all_to_all.ops == 2);
  CHECK(stats.all_to_all.pieces == 2);
  CHECK(stats.all_to_all.bytes == static_cast<int64_t>(2 * (send1.nbytes() + send2.nbytes())));
  CHECK(stats.all_reduce.ops == 3);
  CHECK(stats.all_reduce.pieces == 9);
}

TEST_CASE("comm scheduler: an all-to-all jumps between micro-ops, never into one in flight",
          "[comm][scheduler]") {
  // queued: the communication thread issues it right after the micro-op in flight. caller: it runs
  // at once on the calling thread (on its own communicator), beside the micro-op in flight, and
  // the micro-ops then go on first in first out with no agreement.
  for (comm::Preemption preemption : {comm::Preemption::queued, comm::Preemption::caller}) {
    const bool caller = preemption == comm::Preemption::caller;
    INFO((caller ? "caller" : "queued"));
    auto probe = std::make_shared<Probe>();
    ProbeComm world(probe);
    CommScheduler scheduler(world, 16, SchedulerMode::priority, preemption);
    Tensor grads = random_f32(4, 4, 6);  // 4 micro-ops
    const Tensor expected = grads.clone();
    Tensor send = random_f32(2, 2, 7), recv = Tensor::zeros({2, 2});
    probe->hold_next = true;
    Ticket reduce = scheduler.all_reduce(grads, ReduceOp::sum);
    REQUIRE(probe->wait_holding());  // micro-op 0 is inside the communicator
    Ticket a2a = scheduler.all_to_all_v(send, {2}, recv, {2});
    CHECK_FALSE(scheduler.done(reduce));
    CHECK(scheduler.done(a2a) == caller);
    probe->release();
    scheduler.wait(a2a);
    scheduler.wait(reduce);
    CHECK(order_of(scheduler.execution_log()) == (caller ? "B0 A0 A1 A2 A3" : "A0 B0 A1 A2 A3"));
    CHECK(same_bytes(send, recv));
    CHECK(same_bytes(grads, expected));  // one rank: the sum is the input
    auto stats = scheduler.stats();
    CHECK(stats.all_to_all.wait_seconds >= 0.0);
    CHECK(stats.all_to_all.pieces == 1);
    CHECK(stats.all_reduce.pieces == 4);
    if (caller) CHECK(stats.agreements == 0);  // first in, first out: nothing to agree on
  }
}

TEST_CASE("comm scheduler: errors of the communication thread are rethrown by wait",
          "[comm][scheduler]") {
  auto probe = std::make_shared<Probe>();
  ProbeComm world(probe);
  CommScheduler scheduler(world, 16, SchedulerMode::priority);

  SECTION("a bad all-to-all, then the scheduler carries on") {
    Tensor send = random_f32(3, 2, 8), recv = Tensor::zeros({3, 2});
    Ticket bad = scheduler.all_to_all_v(send, {1, 2}, recv, {3});  // two counts for one rank
    Tensor grads = random_f32(2, 4, 9), expected = grads.clone();
    Ticket good = scheduler.all_reduce(grads, ReduceOp::sum);
    CHECK_THROWS_WITH(scheduler.wait(bad), Catch::Contains("send counts"));
    CHECK_NOTHROW(scheduler.wait(good));
    CHECK(same_bytes(grads, expected));
    CHECK_NOTHROW(scheduler.wait(bad));  // collected: a second wait returns
    CHECK(scheduler.execution_log().at(0).failed);
  }
  SECTION("a failing micro-op fails its ticket; the other micro-ops still run") {
    probe->fail_reduce_index = 2;
    Tensor grads = random_f32(5, 4, 10);  // 5 micro-ops
    Ticket t = scheduler.all_reduce(grads, ReduceOp::sum);
    CHECK_THROWS_WITH(scheduler.wait(t), Catch::Contains("injected failure of allreduce 2"));
    auto log = scheduler.execution_log();
    REQUIRE(log.size() == 5);
    for (size_t i = 0; i < log.size(); ++i) CHECK(log[i].failed == (i == 2));
  }
  SECTION("wait_all rethrows the earliest failure and keeps the later ones") {
    Tensor send = random_f32(1, 2, 11), recv = Tensor::zeros({1, 2});
    Ticket first = scheduler.all_to_all_v(send, {2}, recv, {1});
    Tensor bf = Tensor::zeros({4}, DType::bf16);
    Ticket second = scheduler.all_reduce(bf, ReduceOp::sum);
    CHECK_THROWS_WITH(scheduler.wait_all(), Catch::Contains("send counts sum"));
    CHECK(scheduler.done(first));
    CHECK(scheduler.done(second));
    CHECK_THROWS_WITH(scheduler.wait_all(), Catch::Contains("only f32, i32 and i64"));
    CHECK_NOTHROW(scheduler.wait_all());
  }
  SECTION("a failure nobody waits for is logged by the destructor, not thrown") {
    Tensor bf = Tensor::zeros({4}, DType::bf16);
    scheduler.all_reduce(bf, ReduceOp::sum);
  }
}

TEST_CASE("comm scheduler: bad use is refused", "[comm][scheduler]") {
  auto world = comm::make_local();
  CHECK_THROWS_WITH(CommScheduler(*world, 0, SchedulerMode::priority),
                    Catch::Contains("partition_bytes must be positive"));
  CommScheduler scheduler(*world, 64, SchedulerMode::priority);
  CHECK_THROWS_WITH(scheduler.wait(Ticket{7}), Catch::Contains("never issued"));
  CHECK_THROWS_WITH(scheduler.done(Ticket{}), Catch::Contains("never issued"));
  Tensor undefined;
  CHECK_THROWS_WITH(scheduler.all_reduce(undefined, ReduceOp::sum), Catch::Contains("undefined"));
  Tensor grads = random_f32(2, 3, 12);
  scheduler.pause();
  Ticket t = scheduler.all_reduce(grads, ReduceOp::sum);
  CHECK_FALSE(scheduler.done(t));
  CHECK_THROWS_WITH(scheduler.wait(t), Catch::Contains("while paused"));
  CHECK_THROWS_WITH(scheduler.wait_all(), Catch::Contains("while paused"));
  scheduler.resume();
  CHECK_NOTHROW(scheduler.wait(t));
  CHECK(comm::parse_scheduler_mode("priority") == SchedulerMode::priority);
  CHECK(comm::parse_scheduler_mode("off") == SchedulerMode::off);
  CHECK_THROWS_AS(comm::parse_scheduler_mode("lina"), UsageError);
}

TEST_CASE("comm scheduler: the destructor drains what was submitted", "[comm][scheduler]") {
  auto probe = std::make_shared<Probe>();
  ProbeComm world(probe);
  {
    CommScheduler scheduler(world, 16, SchedulerMode::priority);
    Tensor grads = random_f32(8, 4, 13);  // 8 micro-ops
    scheduler.pause();
    scheduler.all_reduce(grads, ReduceOp::sum);
  }
  CHECK(probe->reduces.size() == 8);
}

TEST_CASE("comm scheduler: no micro-op starts while a caller's all-to-all runs",
          "[comm][scheduler]") {
  // An all-to-all that takes 100 ms on the caller's thread, submitted right after 8 micro-ops of
  // 5 ms each: without the preemption the communication thread would issue all of them during it.
  struct SlowA2A final : public comm::Communicator {
    std::shared_ptr<Probe> probe;
    ProbeComm inner;
    size_t reduces_during = 0;
    explicit SlowA2A(std::shared_ptr<Probe> p) : probe(p), inner(p) {}
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::string name() const override { return "slow-a2a"; }
    std::unique_ptr<Communicator> split(int color, int) override {
      if (color < 0) return nullptr;
      return std::make_unique<ProbeComm>(probe);
    }
    std::unique_ptr<Communicator> split_node() override { return split(0, 0); }
    Request iall_reduce(Tensor& b, ReduceOp op) override { return inner.iall_reduce(b, op); }
    Request iall_gather(const Tensor& s, Tensor& r) override { return inner.iall_gather(s, r); }
    Request iall_gatherv(const Tensor& s, Tensor& r, std::span<const int64_t> c) override {
      return inner.iall_gatherv(s, r, c);
    }
    Request iall_to_all_v(const Tensor& s, std::span<const int64_t> sc, Tensor& r,
                          std::span<const int64_t> rc) override {
      size_t before;
      {
        std::lock_guard<std::mutex> lock(probe->mutex);
        before = probe->reduces.size();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      {
        std::lock_guard<std::mutex> lock(probe->mutex);
        reduces_during = probe->reduces.size() - before;
      }
      return inner.iall_to_all_v(s, sc, r, rc);
    }
    Request ibroadcast(Tensor& b, int root) override { return inner.ibroadcast(b, root); }
    Request isend(const Tensor& b, int p, int t) override { return inner.isend(b, p, t); }
    Request irecv(Tensor& b, int p, int t) override { return inner.irecv(b, p, t); }
    void barrier() override {}
  };
  auto probe = std::make_shared<Probe>();
  SlowA2A a2a_comm(probe);
  ProbeComm world(probe);
  CommScheduler scheduler(world, 16, SchedulerMode::priority, comm::Preemption::caller);
  Tensor grads = random_f32(8, 4, 10);
  probe->delay_ms = 5;
  Ticket reduce = scheduler.all_reduce(grads, ReduceOp::sum);
  comm::AllToAllV exchange(a2a_comm, comm::A2AAlgorithm::flat);
  Tensor send = random_f32(2, 2, 11), recv = Tensor::zeros({2, 2});
  scheduler.all_to_all_v(send, {2}, recv, {2}, &exchange);
  scheduler.wait(reduce);
  // At most the one micro-op the thread had already taken when the all-to-all began.
  CHECK(a2a_comm.reduces_during <= 1);
  CHECK(probe->reduces.size() == 8);
  CHECK(same_bytes(send, recv));
}
