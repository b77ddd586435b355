// Offloaded experts under expert parallelism (train::Trainer with --offload host and --ep W on W
// ranks): each rank's store holds its own experts and trains them bitwise as the same run with
// every expert resident; with expert replicas each expert's gradient is summed over them first.
// Runs on 2 ranks (EP=2; DP2) and 4 ranks (EP=4; DP2 x EP2).
#include <catch2/catch.hpp>
#include <cstring>

#include "moe/comm/communicator.h"
#include "moe/train/trainer.h"
#include "support/models.h"
#include "support/run.h"

moe::comm::Communicator& dist_world();

using namespace moe;

namespace {

ModelConfig offload_model(Arch arch) {
  ModelConfig c = test::small_model_config(arch);
  if (arch == Arch::gpt) c.router_jitter = 0.05;  // keyed by each token's place: the same noise
  c.resolve();
  return c;
}

train::TrainConfig offload_train(int64_t ep, double clip, const std::string& offload) {
  train::TrainConfig t;
  t.data = test::fortunes_path("linux");
  t.batch = 8;
  t.steps = 3;
  t.warmup = 1;
  t.eval_batches = 1;
  t.seed = 5;
  t.ep = ep;
  t.clip = clip;
  t.offload.tier = offload::parse_tier(offload);
  return t;
}

// The first parameter of `offloaded` whose values differ from `resident`'s ("" when none): the
// offloaded run's experts are read back from its store, one expert at a time.
std::string first_difference(train::Trainer& resident, train::Trainer& offloaded) {
  const offload::TieredStore* store = offloaded.expert_store();
  for (Param* p : offloaded.params().all()) {
    const Param& q = resident.params().at(p->name);
    if (!p->offloaded) {
      if (p->value.nbytes() != q.value.nbytes() ||
          std::memcmp(p->value.raw(), q.value.raw(), p->value.nbytes()) != 0)
        return p->name;
      continue;
    }
    if (p->shape != q.value.shape()) return p->name + " (shape)";
    for (int64_t e = 0; e < p->shape[0]; ++e) {
      const Tensor mine = store->read(*p, e, "value");
      const Tensor want = q.value.rows(e, e + 1).clone();
      if (mine.nbytes() != want.nbytes() || std::memcmp(mine.raw(), want.raw(), want.nbytes()) != 0)
        return str(p->name, " expert ", e);
    }
  }
  return "";
}

// Three steps of both runs: the same losses and norms every step, the same parameters after.
void train_side_by_side(train::Trainer& resident, train::Trainer& offloaded, int rank) {
  for (int i = 0; i < 3; ++i) {
    const train::StepStats a = resident.step(), b = offloaded.step();
    INFO("step " << i + 1);
    REQUIRE(a.forward.loss == b.forward.loss);
    REQUIRE(a.grad_norm == b.grad_norm);
  }
  const std::string where = first_difference(resident, offloaded);
  INFO("rank " << rank << ": first differing parameter: " << where);
  REQUIRE(where.empty());
}

}  // namespace

TEST_CASE("offload: --ep W with --offload host|ssd trains bitwise as resident on every rank",
          "[dist][offload]") {
  comm::Communicator& world = dist_world();
  const int64_t ep = world.size();
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    // clip 1: each expert's AdamW after backward (the norm needs every gradient); clip 0: during
    // backward, as each expert's gradient is final.
    for (double clip : {1.0, 0.0}) {
      DYNAMIC_SECTION(arch_name(arch) << ", clip " << clip << ", " << ep << " ranks") {
        train::Trainer resident(offload_model(arch), offload_train(ep, clip, "none"), {}, &world);
        // gpt on the host tier, mixtral on the SSD tier (each rank its own files and cache).
        train::TrainConfig off = offload_train(ep, clip, arch == Arch::gpt ? "host" : "ssd");
        test::ScratchDir ssd(str("offload-dist-rank", world.rank()));
        off.offload.ssd_dir = ssd.path();
        if (arch != Arch::gpt) off.offload.host_budget = "200KiB";  // two experts: the cache evicts
        train::Trainer offloaded(offload_model(arch), off, {}, &world);
        REQUIRE(offloaded.expert_store() != nullptr);
        REQUIRE(offloaded.params().at("blocks.0.moe.experts.w1").offloaded);
        REQUIRE(offloaded.params().at("blocks.0.moe.experts.w1").shape[0] == 4 / ep);
        REQUIRE(first_difference(resident, offloaded) == "");
        train_side_by_side(resident, offloaded, world.rank());
        const offload::StoreStats s = offloaded.expert_store()->stats();
        const int64_t updates = 3 * 2 * (4 / ep);  // steps x MoE layers x this rank's experts
        REQUIRE(s.optimizer_overlapped + s.optimizer_after == updates);
        REQUIRE(s.optimizer_overlapped == (clip == 0 ? updates : 0));
      }
    }
  }
}

TEST_CASE("offload: expert replicas sum their gradients and train bitwise as resident",
          "[dist][offload]") {
  comm::Communicator& world = dist_world();
  // Two replicas of each expert: 2 ranks of pure data parallelism, or 4 ranks as DP2 x EP2. (With
  // more replicas the sum's order is MPI's choice for the message size, which differs between
  // the resident run's fused buffer and the store's per-expert tensors: equal up to rounding.)
  const int64_t ep = world.size() / 2;
  for (double clip : {1.0, 0.0}) {
    DYNAMIC_SECTION("clip " << clip << ", " << world.size() << " ranks, --ep " << ep) {
      train::Trainer resident(offload_model(Arch::mixtral), offload_train(ep, clip, "none"), {},
                              &world);
      train::Trainer offloaded(offload_model(Arch::mixtral), offload_train(ep, clip, "host"), {},
                               &world);
      train_side_by_side(resident, offloaded, world.rank());
      // The replicas' sum comes first: no update overlaps backward.
      REQUIRE(offloaded.expert_store()->stats().optimizer_overlapped == 0);
    }
  }
}
