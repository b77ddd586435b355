// The local (single-rank) communicator: collectives are identity-like copies after the same
// argument checks as the MPI backend (R = 1 peer, counts in rows of the leading dimension).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/comm/local.h"
#include "support/gradcheck.h"

using namespace moe;
using comm::ReduceOp;
using comm::Request;

namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("comm local: identity, split and split_node", "[comm]") {
  auto c = comm::make_local();
  CHECK(c->rank() == 0);
  CHECK(c->size() == 1);
  CHECK(c->name() == "local");
  auto sub = c->split(3, 7);
  REQUIRE(sub);
  CHECK(sub->size() == 1);
  CHECK(c->split(-1, 0) == nullptr);
  auto node = c->split_node();
  REQUIRE(node);
  CHECK(node->rank() == 0);
  CHECK(node->size() == 1);
  c->barrier();
}

TEST_CASE("comm local: all_reduce leaves values and checks dtypes", "[comm]") {
  auto c = comm::make_local();
  Tensor f = test::random_tensor({3, 4}, 101);
  Tensor before = f.clone();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) c->all_reduce(f, op);
  CHECK(same_bytes(f, before));
  Tensor i64 = Tensor::zeros({5}, DType::i64);
  CHECK_NOTHROW(c->all_reduce(i64, ReduceOp::max));
  Tensor h = f.to(DType::bf16);
  CHECK_THROWS_WITH(c->all_reduce(h, ReduceOp::sum), Catch::Contains("only f32, i32 and i64"));
  Tensor u = Tensor::zeros({2}, DType::u8);
  CHECK_THROWS_AS(c->all_reduce(u, ReduceOp::sum), Error);
  Tensor undefined;
  CHECK_THROWS_WITH(c->all_reduce(undefined, ReduceOp::sum), Catch::Contains("undefined"));
}

TEST_CASE("comm local: all_gather and all_gatherv copy and check shapes", "[comm]") {
  auto c = comm::make_local();
  Tensor send = test::random_tensor({3, 4}, 102);
  Tensor recv = Tensor::zeros({3, 4});
  c->all_gather(send, recv);
  CHECK(same_bytes(send, recv));
  Tensor wrong = Tensor::zeros({2, 4});
  CHECK_THROWS_WITH(c->all_gather(send, wrong), Catch::Contains("must hold 1 x 12"));
  Tensor other_dtype = Tensor::zeros({3, 4}, DType::i32);
  CHECK_THROWS_WITH(c->all_gather(send, other_dtype), Catch::Contains("differ in dtype"));

  Tensor recv_v = Tensor::zeros({3, 4});
  std::vector<int64_t> counts{3};
  c->all_gatherv(send, recv_v, counts);
  CHECK(same_bytes(send, recv_v));
  std::vector<int64_t> two{3, 0};
  CHECK_THROWS_WITH(c->all_gatherv(send, recv_v, two), Catch::Contains("2 recv counts for 1"));
  std::vector<int64_t> short_count{2};
  CHECK_THROWS_WITH(c->all_gatherv(send, recv_v, short_count), Catch::Contains("recv_counts[0]"));
  Tensor wide = Tensor::zeros({3, 5});
  CHECK_THROWS_WITH(c->all_gatherv(send, wide, counts), Catch::Contains("differ in width"));
  Tensor zero_rows = Tensor::zeros({0, 4});
  std::vector<int64_t> zero{0};
  Tensor zero_recv = Tensor::zeros({0, 4});
  CHECK_NOTHROW(c->all_gatherv(zero_rows, zero_recv, zero));
}

TEST_CASE("comm local: all_to_all_v copies and checks counts", "[comm]") {
  auto c = comm::make_local();
  Tensor send = test::random_tensor({5, 3}, 103).to(DType::bf16);
  Tensor recv = Tensor::zeros({5, 3}, DType::bf16);
  std::vector<int64_t> five{5};
  c->all_to_all_v(send, five, recv, five);
  CHECK(same_bytes(send, recv));
  std::vector<int64_t> four{4};
  CHECK_THROWS_WITH(c->all_to_all_v(send, four, recv, five),
                    Catch::Contains("send counts sum to 4"));
  CHECK_THROWS_WITH(c->all_to_all_v(send, five, recv, four),
                    Catch::Contains("recv counts sum to 4"));
  std::vector<int64_t> negative{-1};
  Tensor empty = Tensor::zeros({0, 3}, DType::bf16);
  CHECK_THROWS_WITH(c->all_to_all_v(empty, negative, empty, negative),
                    Catch::Contains("is negative"));
  std::vector<int64_t> none;
  CHECK_THROWS_WITH(c->all_to_all_v(send, none, recv, five), Catch::Contains("for 1 ranks"));
  std::vector<int64_t> zero{0};
  CHECK_NOTHROW(c->all_to_all_v(empty, zero, empty, zero));
  Tensor scalar = Tensor::zeros({});
  CHECK_THROWS_WITH(c->all_to_all_v(scalar, zero, scalar, zero),
                    Catch::Contains("no leading dimension"));
}

TEST_CASE("comm local: broadcast, send and recv to self", "[comm]") {
  auto c = comm::make_local();
  Tensor t = test::random_tensor({4}, 104);
  Tensor before = t.clone();
  c->broadcast(t, 0);
  CHECK(same_bytes(t, before));
  CHECK_THROWS_WITH(c->broadcast(t, 1), Catch::Contains("outside the communicator"));

  // A send is buffered; the receive takes it later, in order per tag.
  Tensor a = test::random_tensor({4}, 105), b = test::random_tensor({4}, 106);
  c->send(a, 0, 1);
  c->send(b, 0, 1);
  Tensor got = Tensor::zeros({4});
  Request pending = c->irecv(got, 0, 2);  // posted before its send
  CHECK_FALSE(pending.test());
  c->send(b, 0, 2);
  pending.wait();
  CHECK(same_bytes(got, b));
  c->recv(got, 0, 1);
  CHECK(same_bytes(got, a));
  c->recv(got, 0, 1);
  CHECK(same_bytes(got, b));
  CHECK_THROWS_WITH(c->recv(got, 0, 1), Catch::Contains("wait forever"));
  c->send(Tensor::zeros({3}), 0, 4);
  CHECK_THROWS_WITH(c->recv(got, 0, 4), Catch::Contains("does not fit"));
  CHECK_THROWS_WITH(c->send(a, 2, 0), Catch::Contains("outside the communicator"));
}

TEST_CASE("comm local: requests and check_same_everywhere", "[comm]") {
  auto c = comm::make_local();
  Request done;
  CHECK(done.done());
  CHECK(done.test());
  Tensor t = test::random_tensor({2}, 107);
  std::vector<Request> rs;
  rs.push_back(c->iall_reduce(t, ReduceOp::sum));
  rs.push_back(c->ibroadcast(t, 0));
  CHECK_NOTHROW(comm::wait_all(rs));
  CHECK_NOTHROW(c->check_same_everywhere("config", "{\"a\":1}"));
  CHECK(c->describe() == "local rank 0/1");
  // Without an MPI launcher in the environment, the world is local.
  if (!std::getenv("PMI_RANK") && !std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("PMIX_RANK"))
    CHECK(comm::make_world()->name() == "local");
}
