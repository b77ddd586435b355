// Inference from a sharded checkpoint directory whose experts are placed on ranks in an order of
// its own (moe-convert partition --trace writes such directories; here the placement is given, so
// that it is never the contiguous one by chance). Under --ep every rank serves the experts the
// files put on it, and its per-token NLL equals one process's on the whole checkpoint to float
// rounding: an expert's GEMM then holds another number of rows, which OpenBLAS may round
// differently (1e-6 relative, as the moe-infer --ep script allows). One process reading the same
// directory gets the whole model back, bitwise. Runs on 2 and 4 ranks.
// Shapes: W ranks, E experts of a layer, B batch, T sequence.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/infer/engine.h"
#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "moe/io/convert.h"
#include "support/ring.h"

moe::comm::Communicator& dist_world();
std::string dist_scratch_dir(const std::string& name);

using namespace moe;

TEST_CASE("infer: a sharded checkpoint placed by load serves under --ep as one process", "[dist]") {
  comm::Communicator& world = dist_world();
  const int W = world.size();
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    ModelConfig c = test::small_model_config(arch);
    c.layers = 3;
    c.experts = 8;  // E/W experts per rank for W = 2 and 4
    c.seq = 16;
    c.resolve();
    const std::string dir = dist_scratch_dir(str("moe-dist-sharded-", arch_name(arch)));
    const std::string whole = dir + "/whole.h5", shards = dir + "/shards";
    if (world.rank() == 0) {
      std::filesystem::remove_all(dir);
      std::filesystem::create_directories(dir);
      test::save_ring_model(whole, c, 31);
      // Layer l's rank-major order: the experts rotated by 3 + l and reversed; rank p holds
      // positions [p E/W, (p+1) E/W) of it. Never the contiguous placement.
      io::PartitionOptions options;
      options.ranks = W;
      for (int64_t b = 0; b < c.layers; ++b) {
        const int64_t E = c.experts;
        std::vector<int> rank_of(static_cast<size_t>(E));
        for (int64_t g = 0; g < E; ++g)
          rank_of[static_cast<size_t>((E - 1 - g + 3 + b) % E)] = static_cast<int>(g / (E / W));
        options.placement.push_back(rank_of);
      }
      io::save_sharded(shards, io::partition(io::load_checkpoint(whole), options), false);
      const std::vector<int> map =
          io::load_checkpoint(shards + "/rank-00000.h5", false).sharding.expert_rank;
      std::vector<int> contiguous;
      for (int64_t b = 0; b < c.layers; ++b)
        for (int64_t e = 0; e < c.experts; ++e) contiguous.push_back(static_cast<int>(e / (8 / W)));
      REQUIRE(map != contiguous);
    }
    world.barrier();

    // This rank's batch, and one process's NLL of it from the whole checkpoint.
    const test::RingBatch batch = test::ring_batch(c, 2, 500 + static_cast<uint64_t>(world.rank()));
    infer::LoadedModel one = infer::load_model(whole);
    Tensor want;
    one.model->evaluate(batch.ids, batch.targets, EvalOptions{.row_nll = &want});

    {  // one process reads the directory back to the whole model
      infer::LoadedModel back = infer::load_model(shards);
      for (const Param* p : std::as_const(*back.params).all())
        REQUIRE(test::same_bytes(p->value, one.params->at(p->name).value));
      Tensor got;
      back.model->evaluate(batch.ids, batch.targets, EvalOptions{.row_nll = &got});
      REQUIRE(test::same_bytes(got, want));
    }
    {  // --ep W: each rank serves the experts placed on it
      infer::EngineOptions options;
      options.model = shards;
      options.ep = W;
      std::unique_ptr<infer::Engine> engine =
          infer::Engine::open(options, world.split(0, world.rank()));
      Tensor got;
      engine->model().evaluate(batch.ids, batch.targets, EvalOptions{.row_nll = &got});
      REQUIRE(got.numel() == want.numel());
      double worst = 0;
      for (int64_t i = 0; i < got.numel(); ++i) {
        const double a = got.data<float>()[i], b = want.data<float>()[i];
        worst = std::max(worst, std::abs(a - b) / std::max(1.0, std::abs(b)));
      }
      INFO(arch_name(arch) << ": worst relative NLL difference " << worst);
      REQUIRE(worst <= 1e-6);
    }
    world.barrier();
    if (world.rank() == 0) std::filesystem::remove_all(dir);
  }
}
