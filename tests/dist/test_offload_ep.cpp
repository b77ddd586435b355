// Sharded checkpoints of offloaded expert-parallel runs (issue 16): every rank streams its experts
// from its store into its own file of the checkpoint directory, expert by expert; the files are
// the ones a resident run of the same layout writes, and a resume refills each rank's store from
// them to bitwise the uninterrupted run. Runs on 2 and 4 ranks (--ep = the world).
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "moe/comm/communicator.h"
#include "moe/io/checkpoint.h"
#include "moe/io/checkpoint_dir.h"
#include "moe/train/trainer.h"
#include "support/models.h"
#include "support/run.h"

moe::comm::Communicator& dist_world();
std::string dist_scratch_dir(const std::string& name);

using namespace moe;

namespace {

train::TrainConfig offload_train(int64_t ep, const std::string& offload) {
  train::TrainConfig t;
  t.data = test::fortunes_path("linux");
  t.batch = 8;
  t.steps = 4;
  t.warmup = 2;
  t.eval_batches = 1;
  t.seed = 13;
  t.ep = ep;
  t.offload.tier = offload::parse_tier(offload);
  return t;
}

ModelConfig offload_model(DType dtype) {
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.dtype = dtype;
  c.resolve();
  return c;
}

// Name, shard and bytes of every tensor, in order.
bool same_tensors(const std::vector<io::NamedTensor>& x, const std::vector<io::NamedTensor>& y,
                  std::string& where) {
  if (x.size() != y.size()) {
    where = str(x.size(), " tensors against ", y.size());
    return false;
  }
  for (size_t i = 0; i < x.size(); ++i) {
    const Tensor a = x[i].whole(), b = y[i].whole();
    if (x[i].name != y[i].name || x[i].shard.global != y[i].shard.global ||
        x[i].shard.start != y[i].shard.start || a.shape() != b.shape() || a.dtype() != b.dtype() ||
        std::memcmp(a.raw(), b.raw(), a.nbytes()) != 0) {
      where = x[i].name;
      return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("offload ep: a sharded checkpoint streams each rank's experts and resumes bitwise",
          "[dist]") {
  comm::Communicator& world = dist_world();
  for (DType dtype : {DType::f32, DType::bf16}) {
    const std::string dir = dist_scratch_dir(str("moe-dist-offload-ckpt-", dtype_name(dtype)));
    if (world.rank() == 0) std::filesystem::remove_all(dir);
    world.barrier();
    const train::TrainConfig t = offload_train(world.size(), "host");
    train::Trainer straight(offload_model(dtype), t, {}, &world);
    for (int i = 0; i < 4; ++i) straight.step();
    std::string path;
    {
      train::Trainer first(offload_model(dtype), t, {}, &world);
      for (int i = 0; i < 2; ++i) first.step();
      path = first.save(dir + "/offloaded");
      train::Trainer resident(offload_model(dtype), offload_train(world.size(), "none"), {},
                              &world);
      for (int i = 0; i < 2; ++i) resident.step();
      const std::string resident_path = resident.save(dir + "/resident");
      // This rank's file of each: the same tensors, bitwise.
      const io::Checkpoint a =
          io::load_checkpoint(io::CheckpointDir::rank_file(path, world.rank()));
      const io::Checkpoint b =
          io::load_checkpoint(io::CheckpointDir::rank_file(resident_path, world.rank()));
      std::string where;
      const bool same =
          same_tensors(a.params, b.params, where) && same_tensors(a.optim, b.optim, where);
      INFO(dtype_name(dtype) << " rank " << world.rank() << " file: first difference " << where);
      REQUIRE(same);
    }
    train::Trainer resumed(offload_model(dtype), t, {}, &world);
    resumed.restore(dir + "/offloaded/last");
    REQUIRE(resumed.steps_done() == 2);
    for (int i = 0; i < 2; ++i) resumed.step();
    const io::Checkpoint x = straight.snapshot(), y = resumed.snapshot();
    std::string where;
    const bool same =
        same_tensors(x.params, y.params, where) && same_tensors(x.optim, y.optim, where);
    INFO(dtype_name(dtype) << " rank " << world.rank() << " resumed: first difference " << where);
    REQUIRE(same);
    world.barrier();
    if (world.rank() == 0) std::filesystem::remove_all(dir);
  }
}
