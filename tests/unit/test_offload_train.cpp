// Offloaded training (the tiered ExpertStore, --offload) against resident training: the same
// flags give bitwise the same parameters and optimizer state, whatever the tier, budgets,
// pinning, prefetch, optimizer overlap, gradient accumulation or recomputation.
#include <catch2/catch.hpp>
#include <cstring>

#include "moe/io/checkpoint.h"
#include "moe/train/trainer.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;

namespace {

ModelConfig model(Arch arch, DType dtype = DType::f32) {
  ModelConfig c = test::small_model_config(arch);
  c.capacity_factor = 1.0;  // drops too
  c.router_jitter = 0.01;
  c.dtype = dtype;
  c.resolve();
  return c;
}

train::TrainConfig training(int64_t steps) {
  train::TrainConfig t;
  t.data = test::fortunes_path("computers");
  t.batch = 8;
  t.steps = steps;
  t.lr = 3e-3;
  t.warmup = 2;
  t.eval_batches = 2;
  t.seed = 7;
  return t;
}

// Every parameter and optimizer tensor, by name, bitwise.
void require_same(const train::Trainer& a, const train::Trainer& b) {
  const io::Checkpoint ca = a.snapshot(), cb = b.snapshot();
  auto same = [](const std::vector<io::NamedTensor>& x, const std::vector<io::NamedTensor>& y) {
    REQUIRE(x.size() == y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      INFO(x[i].name);
      REQUIRE(x[i].name == y[i].name);
      REQUIRE(x[i].tensor.shape() == y[i].tensor.shape());
      REQUIRE(x[i].tensor.dtype() == y[i].tensor.dtype());
      REQUIRE(std::memcmp(x[i].tensor.raw(), y[i].tensor.raw(), x[i].tensor.nbytes()) == 0);
    }
  };
  same(ca.params, cb.params);
  same(ca.optim, cb.optim);
}

void run(train::Trainer& t, int steps, std::vector<double>* losses = nullptr) {
  for (int i = 0; i < steps; ++i) {
    const train::StepStats s = t.step();
    if (losses) losses->push_back(s.forward.total);
  }
}

}  // namespace

TEST_CASE("offload: host tier trains bitwise as resident (gpt, mixtral; f32, bf16)",
          "[offload]") {
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (double clip : {1.0, 0.0}) {
        DYNAMIC_SECTION(arch_name(arch) << " " << dtype_name(dtype) << " clip " << clip) {
          train::TrainConfig base = training(5);
          base.clip = clip;
          train::Trainer resident(model(arch, dtype), base, {});
          train::TrainConfig off = base;
          off.offload = "host";
          train::Trainer offloaded(model(arch, dtype), off, {});
          REQUIRE(offloaded.expert_store() != nullptr);
          std::vector<double> lr, lo;
          run(resident, 5, &lr);
          run(offloaded, 5, &lo);
          REQUIRE(lr == lo);
          require_same(resident, offloaded);
          const offload::StoreStats st = offloaded.expert_store()->stats();
          if (clip == 0) REQUIRE(st.optimizer_overlapped > 0);
          else REQUIRE(st.optimizer_overlapped == 0);
        }
      }
    }
  }
}
