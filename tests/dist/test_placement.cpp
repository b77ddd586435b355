// Dynamic expert placement (nn::Parallel::placement): whatever ranks compute an expert's rows, and
// however a replicated expert's rows are split between its replicas, every rank's logits are the
// ones one process computes for its tokens. Not bitwise: an expert's GEMM then holds another
// number of rows, and OpenBLAS may round a row differently with another row count (its small-
// matrix kernels); the worst difference seen is 2e-7 on logits of magnitude ~1. Also Lina's policy
// on a real group: the same plan on every rank. Runs on 2 and 4 ranks.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "moe/comm/all_to_all.h"
#include "moe/comm/communicator.h"
#include "moe/infer/placement.h"
#include "moe/models/transformer.h"
#include "moe/rng.h"
#include "support/models.h"

moe::comm::Communicator& dist_world();

using namespace moe;

namespace {

// Random replica sets, the same on every rank: a function of (block, call).
class RandomPlacement : public nn::PlacementPolicy {
 public:
  explicit RandomPlacement(int ranks) : ranks_(ranks) {}
  nn::ExpertAssignment place(int64_t block, const Tensor&,
                             const std::vector<int32_t>& tokens_per_expert) override {
    nn::ExpertAssignment a;
    uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(block * 131 + calls_++ + 1);
    auto next = [&] {  // xorshift64
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      return state;
    };
    for (size_t e = 0; e < tokens_per_expert.size(); ++e) {
      std::vector<int32_t> ranks(static_cast<size_t>(ranks_));
      for (int p = 0; p < ranks_; ++p) ranks[static_cast<size_t>(p)] = p;
      for (int p = ranks_ - 1; p > 0; --p)
        std::swap(ranks[static_cast<size_t>(p)], ranks[next() % static_cast<uint64_t>(p + 1)]);
      ranks.resize(1 + next() % static_cast<uint64_t>(ranks_));
      a.replicas.push_back(ranks);
    }
    return a;
  }

 private:
  int ranks_;
  int64_t calls_ = 0;
};

// Rank r's batch: [2, T] ids drawn from (seed, r).
Tensor rank_ids(const ModelConfig& c, int rank) {
  Tensor ids = Tensor::empty({2, c.seq}, DType::i32);
  for (int64_t i = 0; i < ids.numel(); ++i)
    ids.data<int32_t>()[i] = static_cast<int32_t>((i * 37 + rank * 101 + i * i) % c.vocab_size);
  return ids;
}

}  // namespace

TEST_CASE("placement: any expert assignment gives one process's logits", "[dist]") {
  comm::Communicator& world = dist_world();
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    ModelConfig c = test::small_model_config(arch);
    c.vocab_size = 64;
    c.experts = 6;  // not a multiple of 4: only a placement can spread it over 4 ranks
    c.resolve();
    ParamSet single_params(7, c.dtype);
    Transformer single(c, single_params);
    comm::AllToAllV a2a(world, comm::A2AAlgorithm::flat);
    RandomPlacement policy(world.size());
    nn::Parallel parallel;
    parallel.experts = &world;
    parallel.exchange = &a2a;
    parallel.placement = &policy;
    ParamSet placed_params(7, c.dtype);
    Transformer placed(c, placed_params, &parallel);
    for (int round = 0; round < 3; ++round) {
      const Tensor ids = rank_ids(c, world.rank() + round * world.size());
      const Tensor want = single.logits(ids), got = placed.logits(ids);
      REQUIRE(want.shape() == got.shape());
      double worst = 0, scale = 0;
      for (int64_t i = 0; i < want.numel(); ++i) {
        worst = std::max(worst, double(std::abs(want.data<float>()[i] - got.data<float>()[i])));
        scale = std::max(scale, double(std::abs(want.data<float>()[i])));
      }
      INFO("worst difference " << worst << " of logits up to " << scale);
      CHECK(worst <= 1e-5 * std::max(scale, 1.0));
    }
  }
}

TEST_CASE("placement: Lina's plan is the same on every rank and balances a skewed layer",
          "[dist]") {
  comm::Communicator& world = dist_world();
  const int R = world.size();
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.experts = 8;
  c.resolve();
  // A table whose layer-1 estimate depends on the layer-0 expert: path {e} -> mostly expert e.
  profile::PathTable table;
  table.path_length = 1;
  table.top_k = 2;
  table.experts = {8, 8};
  table.marginal = {{45, 45, 2, 2, 2, 2, 1, 1}, {1, 1, 1, 1, 1, 1, 1, 1}};
  table.next.resize(1);
  for (int32_t e = 0; e < 8; ++e) {
    std::vector<int64_t> counts(8, 1);
    counts[static_cast<size_t>(e)] = 50;
    table.next[0][{e}] = counts;
  }
  infer::LinaPlacement lina(table, c, world);
  // Layer 0: every rank's tokens all pick experts 0 and 1 (the marginal's guess).
  const int64_t N = 6;
  Tensor idx = Tensor::empty({N, 2}, DType::i32);
  for (int64_t t = 0; t < N; ++t) {
    idx.data<int32_t>()[t * 2] = 0;
    idx.data<int32_t>()[t * 2 + 1] = 1;
  }
  std::vector<int32_t> load(8, 0);
  load[0] = load[1] = static_cast<int32_t>(N);
  nn::ExpertAssignment a = lina.place(0, idx, load);
  // Experts 0 and 1 carry 90% of the estimate: R/2 ranks each, disjoint; the same plan everywhere.
  CHECK(a.replicas[0].size() == static_cast<size_t>(R / 2));
  CHECK(a.replicas[1].size() == static_cast<size_t>(R / 2));
  std::vector<int32_t> flat;
  for (const auto& reps : a.replicas) {
    flat.push_back(static_cast<int32_t>(reps.size()));
    flat.insert(flat.end(), reps.begin(), reps.end());
  }
  Tensor mine = Tensor::empty({static_cast<int64_t>(flat.size())}, DType::i32);
  std::memcpy(mine.raw(), flat.data(), flat.size() * sizeof(int32_t));
  Tensor all = Tensor::empty({R, mine.numel()}, DType::i32);
  world.all_gather(mine, all);
  for (int r = 0; r < R; ++r)
    CHECK(std::memcmp(all.data<int32_t>() + r * mine.numel(), flat.data(), mine.nbytes()) == 0);
  // Layer 1: rank r's tokens pick expert r % 8 and 7 - r % 8; the estimate from paths (all 0)
  // expects expert 0, so phase 2 re-plans from the actual loads.
  for (int64_t t = 0; t < N; ++t) {
    idx.data<int32_t>()[t * 2] = world.rank() % 8 == 7 ? 6 : world.rank() % 8;
    idx.data<int32_t>()[t * 2 + 1] = 7;
  }
  load.assign(8, 0);
  load[static_cast<size_t>(idx.data<int32_t>()[0])] = static_cast<int32_t>(N);
  load[7] = static_cast<int32_t>(N);
  lina.place(1, idx, load);
  const std::vector<infer::PlacementLayerStats> stats = lina.stats();
  REQUIRE(stats.size() == 2);
  CHECK(stats[0].replans == 0);
  CHECK(stats[1].replans == 1);
  // Layer 0: the static layout puts experts 0 and 1 (all rows) on rank 0; the plan spreads them.
  CHECK(stats[0].static_max_over_mean == Approx(double(R)));
  CHECK(stats[0].placed_max_over_mean == Approx(1.0));
}
