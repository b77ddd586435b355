// Hierarchical all-to-all-v on the launcher-free local communicator (R = 1): one node of one rank,
// so it degenerates to the flat copy; bad node sizes are refused without MPI.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "moe/comm/hierarchical_a2a.h"
#include "moe/comm/local.h"

using namespace moe;
using comm::HierarchicalAllToAll;

TEST_CASE("hierarchical a2a local: one rank is one node and copies like the flat call", "[unit]") {
  auto world = comm::make_local();
  for (int ranks_per_node : {0, 1}) {
    HierarchicalAllToAll hier(*world, ranks_per_node);
    CHECK(hier.nodes() == 1);
    CHECK(hier.ranks_per_node() == 1);
    CHECK(hier.degenerate());
    Tensor send = Tensor::empty({5, 3});
    for (int64_t i = 0; i < send.numel(); ++i) send.data<float>()[i] = 0.5f * i - 3.0f;
    Tensor recv = Tensor::zeros({5, 3});
    std::vector<int64_t> counts{5};
    hier.all_to_all_v(send, counts, recv, counts);
    CHECK(std::memcmp(send.raw(), recv.raw(), send.nbytes()) == 0);
  }
}

TEST_CASE("hierarchical a2a local: refuses node sizes that do not divide the world", "[unit]") {
  auto world = comm::make_local();
  CHECK_THROWS_WITH(HierarchicalAllToAll(*world, 2),
                    Catch::Contains("world size 1 is not divisible by ranks_per_node 2"));
  CHECK_THROWS_AS(HierarchicalAllToAll(*world, -3), moe::UsageError);
  HierarchicalAllToAll hier(*world, 1);
  Tensor send = Tensor::zeros({2, 3}), recv = Tensor::zeros({2, 4});
  std::vector<int64_t> counts{2};
  CHECK_THROWS_WITH(hier.all_to_all_v(send, counts, recv, counts),
                    Catch::Contains("differ in width"));
}
