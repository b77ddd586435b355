// Column-sharded embedding (nn::ShardedEmbedding) on real MPI ranks, against nn::Embedding on the
// full table built from the same seed. W = world size. Ids and dy are pure functions of (rank,
// index), so forward is compared on each rank's own tokens; backward gathers every rank's ids and
// dy (all_gatherv) to run the full embedding over the global batch. Every comparison is bitwise.
// Assertions are CHECKs after the collectives, so a failing rank never leaves the others waiting.
#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/nn/embedding.h"
#include "moe/nn/sharded_embedding.h"
#include "moe/rng.h"

moe::comm::Communicator& dist_world();  // main.cpp

using namespace moe;

namespace {

constexpr uint64_t kSeed = 5;
constexpr int64_t kRows = 7;  // few rows: ids repeat within and across ranks
constexpr float kStd = 0.5f;
const char* const kName = "embed.tokens";

// dim 12 divides over 2, 3, 4 and 6 ranks.
int64_t test_dim(int W) { return 12 % W == 0 ? 12 : 2 * W; }

Tensor make_ids(int rank, const Shape& shape, uint64_t salt) {
  Tensor ids = Tensor::empty(shape, DType::i32);
  for (int64_t i = 0; i < ids.numel(); ++i)
    ids.data<int32_t>()[i] = static_cast<int32_t>(
        rng_below(rng_key(salt, {static_cast<uint64_t>(rank)}), static_cast<uint64_t>(i), kRows));
  return ids;
}

Tensor make_dy(int rank, int64_t n, int64_t dim, uint64_t salt) {
  Tensor dy = Tensor::empty({n, dim});
  for (int64_t i = 0; i < dy.numel(); ++i)
    dy.data<float>()[i] = rng_normal(rng_key(salt, {static_cast<uint64_t>(rank)}), i);
  return dy;
}

// Elements of `local` [rows, C] that differ bitwise from columns [start, start + C) of `full`.
int64_t column_mismatches(const Tensor& local, const Tensor& full, int64_t start) {
  const int64_t rows = local.dim(0), C = local.dim(1), dim = full.dim(1);
  const float* l = local.data<float>();
  const float* f = full.data<float>();
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r)
    bad += std::memcmp(l + r * C, f + r * dim + start, sizeof(float) * C) != 0;
  return bad;
}

// Token shapes per rank for the forward/backward cases (rank-dependent n, empty ranks, [B,T]).
Shape case_shape(int pattern, int rank) {
  switch (pattern) {
    case 0:
      return {3 + 2 * rank};
    case 1:
      return {rank == 1 ? 0 : 5};
    case 2:
      return {2, 3 + rank};
    default:
      return {0};  // no tokens anywhere
  }
}
constexpr int kPatterns = 4;

// Every rank's rows of `local` (leading dimension), rank-major.
Tensor gather_rows(comm::Communicator& world, const Tensor& local) {
  const int W = world.size();
  Tensor count = Tensor::empty({1}, DType::i64);
  count.data<int64_t>()[0] = local.dim(0);
  Tensor counts = Tensor::empty({W}, DType::i64);
  world.all_gather(count, counts);
  std::vector<int64_t> c(counts.data<int64_t>(), counts.data<int64_t>() + W);
  Shape shape = local.shape();
  shape[0] = std::accumulate(c.begin(), c.end(), int64_t{0});
  Tensor all = Tensor::empty(shape, local.dtype());
  world.all_gatherv(local, all, c);
  return all;
}

}  // namespace

TEST_CASE("sharded embedding: the shard holds the full table's columns", "[dist]") {
  comm::Communicator& world = dist_world();
  const int W = world.size(), me = world.rank();
  const int64_t dim = test_dim(W);
  for (DType dtype : {DType::f32, DType::bf16}) {
    ParamSet ps(kSeed, dtype), ref(kSeed, dtype);
    nn::ShardedEmbedding sharded(ps, kName, kRows, dim, kStd, world);
    nn::Embedding full(ref, kName, kRows, dim, kStd);
    const Param& p = sharded.table();
    INFO("dtype " << dtype_name(dtype) << " rank " << me);
    CHECK(p.name == kName);
    CHECK(!p.decay);
    CHECK(p.value.shape() == Shape{kRows, dim / W});
    CHECK(p.grad.shape() == Shape{kRows, dim / W});
    CHECK(p.shard.defined());
    CHECK(p.shard.global == Shape{kRows, dim});
    CHECK(p.shard.dim == 1);
    CHECK(sharded.rows() == kRows);
    CHECK(sharded.dim() == dim);
    CHECK(sharded.columns() == dim / W);
    CHECK(sharded.column_start() == me * dim / W);
    CHECK(p.shard.start == sharded.column_start());
    CHECK(p.shard.count == sharded.columns());
    CHECK(column_mismatches(p.w(), full.table().w(), sharded.column_start()) == 0);
    CHECK(column_mismatches(p.value.to(DType::f32), full.table().value.to(DType::f32),
                            sharded.column_start()) == 0);
  }
}

TEST_CASE("sharded embedding: forward equals the full table's lookup bitwise", "[dist]") {
  comm::Communicator& world = dist_world();
  const int W = world.size(), me = world.rank();
  const int64_t dim = test_dim(W);
  ParamSet ps(kSeed), ref(kSeed);
  nn::ShardedEmbedding sharded(ps, kName, kRows, dim, kStd, world);
  nn::Embedding full(ref, kName, kRows, dim, kStd);
  for (int pattern = 0; pattern < kPatterns; ++pattern) {
    Tensor ids = make_ids(me, case_shape(pattern, me), 100 + pattern);
    nn::ShardedEmbedding::Saved saved;
    Tensor out = sharded.forward(ids, &saved);
    Tensor expected = full.forward(ids);
    INFO("pattern " << pattern << " rank " << me << " ids " << ids.describe());
    CHECK(out.shape() == Shape{ids.numel(), dim});
    CHECK((out.shape() == expected.shape() &&
           std::memcmp(out.raw(), expected.raw(), expected.nbytes()) == 0));
    // Saved: every rank's ids, rank-major, and every rank's count.
    CHECK(static_cast<int>(saved.counts.size()) == W);
    int64_t total = 0;
    for (int r = 0; r < W; ++r) {
      CHECK(saved.counts[r] == shape_numel(case_shape(pattern, r)));
      Tensor theirs = make_ids(r, {saved.counts[r]}, 100 + pattern);
      CHECK(std::memcmp(saved.ids.data<int32_t>() + total, theirs.raw(), theirs.nbytes()) == 0);
      total += saved.counts[r];
    }
    CHECK(saved.ids.numel() == total);
  }
}

TEST_CASE("sharded embedding: backward equals the full table's gradient columns bitwise",
          "[dist]") {
  comm::Communicator& world = dist_world();
  const int W = world.size(), me = world.rank();
  const int64_t dim = test_dim(W);
  for (int pattern = 0; pattern < kPatterns; ++pattern) {
    ParamSet ps(kSeed), ref(kSeed);
    nn::ShardedEmbedding sharded(ps, kName, kRows, dim, kStd, world);
    nn::Embedding full(ref, kName, kRows, dim, kStd);
    // Two steps, so that accumulation (+=) into the gradient is covered too.
    for (int step = 0; step < 2; ++step) {
      Tensor ids = make_ids(me, case_shape(pattern, me), 200 + 10 * step + pattern);
      nn::ShardedEmbedding::Saved saved;
      sharded.forward(ids, &saved);
      Tensor dy = make_dy(me, ids.numel(), dim, 300 + 10 * step + pattern);
      sharded.backward(dy, saved);
      Tensor all_ids = gather_rows(world, ids.reshape({ids.numel()}));
      Tensor all_dy = gather_rows(world, dy);
      full.backward(all_dy, all_ids);
    }
    INFO("pattern " << pattern << " rank " << me);
    CHECK(column_mismatches(sharded.table().grad, full.table().grad, sharded.column_start()) == 0);
    // Rows nobody touched stay zero; with 7 rows and repeats, some rows got several tokens.
    int64_t nonzero = 0;
    for (int64_t i = 0; i < sharded.table().grad.numel(); ++i)
      nonzero += sharded.table().grad.data<float>()[i] != 0.0f;
    if (pattern != 3)
      CHECK(nonzero > 0);
    else
      CHECK(nonzero == 0);
  }
}

TEST_CASE("sharded embedding: a dim that does not divide over the ranks is refused everywhere",
          "[dist]") {
  comm::Communicator& world = dist_world();
  const int W = world.size();
  for (int64_t dim : {int64_t{W} + 1, W == 4 ? int64_t{6} : int64_t{5}}) {
    ParamSet ps(kSeed);
    INFO("dim " << dim << " W " << W);
    CHECK_THROWS_MATCHES(nn::ShardedEmbedding(ps, kName, kRows, dim, kStd, world), UsageError,
                         Catch::Matchers::Predicate<UsageError>(
                             [&](const UsageError& e) {
                               std::string m = e.what();
                               return m.find("--shard-embedding") != std::string::npos &&
                                      m.find("dim " + std::to_string(dim)) != std::string::npos &&
                                      m.find("W = " + std::to_string(W)) != std::string::npos &&
                                      m.find(kName) != std::string::npos;
                             },
                             "names --shard-embedding, the dim, W and the table"));
  }
}

TEST_CASE("sharded embedding: an id out of range on one rank throws on every rank", "[dist]") {
  comm::Communicator& world = dist_world();
  const int W = world.size(), me = world.rank();
  const int64_t dim = test_dim(W);
  ParamSet ps(kSeed);
  nn::ShardedEmbedding sharded(ps, kName, kRows, dim, kStd, world);
  struct Bad {
    int rank;
    int32_t id;
  };
  for (Bad bad : {Bad{W - 1, static_cast<int32_t>(kRows)}, Bad{0, -3}}) {
    Tensor ids = make_ids(me, {4}, 400);
    if (me == bad.rank) ids.data<int32_t>()[2] = bad.id;
    INFO("bad id " << bad.id << " on rank " << bad.rank << ", this is rank " << me);
    CHECK_THROWS_WITH(sharded.forward(ids, nullptr),
                      Catch::Contains("id " + std::to_string(bad.id)) &&
                          Catch::Contains("rank " + std::to_string(bad.rank)) &&
                          Catch::Contains(kName) && Catch::Contains("out of range"));
  }
  // Nobody was left inside a collective: the group still works.
  Tensor ids = make_ids(me, {3}, 401);
  Tensor out = sharded.forward(ids, nullptr);
  CHECK(out.shape() == Shape{3, dim});
}
