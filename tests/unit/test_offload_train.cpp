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

TEST_CASE("offload: host tier trains bitwise as resident (gpt, mixtral; f32, bf16)", "[offload]") {
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
          if (clip == 0)
            REQUIRE(st.optimizer_overlapped > 0);
          else
            REQUIRE(st.optimizer_overlapped == 0);
        }
      }
    }
  }
}

TEST_CASE("offload: every store setting trains bitwise as resident", "[offload]") {
  struct Setting {
    const char* name;
    void (*apply)(train::TrainConfig&);
    bool one_slot = false;  // a device budget of exactly one expert
  };
  const Setting settings[] = {
      {"one device slot", [](train::TrainConfig&) {}, true},
      {"no prefetch", [](train::TrainConfig& t) { t.prefetch_depth = 0; }},
      {"deep prefetch", [](train::TrainConfig& t) { t.prefetch_depth = 8; }},
      {"no pinning", [](train::TrainConfig& t) { t.pin_fraction = 0; }},
      {"all pinned", [](train::TrainConfig& t) { t.pin_fraction = 1; }},
      {"optimizer after backward", [](train::TrainConfig& t) { t.optimizer_overlap = false; }},
      {"grad-accum 2", [](train::TrainConfig& t) { t.grad_accum = 2; }},
      {"recompute moe", [](train::TrainConfig& t) { t.recompute = "moe"; }},
      {"recompute block", [](train::TrainConfig& t) { t.recompute = "block"; }},
  };
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    for (const Setting& setting : settings) {
      DYNAMIC_SECTION(arch_name(arch) << ": " << setting.name) {
        train::TrainConfig base = training(4);
        base.clip = 0;  // the optimizer overlaps backward
        setting.apply(base);
        // Accumulation and recomputation apply to both runs; the store's settings only count
        // for the offloaded one.
        train::Trainer resident(model(arch), base, {});
        train::TrainConfig off = base;
        off.offload = "host";
        if (setting.one_slot) {  // exactly one slot: one expert's fp32 weights
          const ModelConfig mc = model(arch);
          const int64_t D = mc.d_model, F = mc.d_ff;
          const int64_t one = (arch == Arch::gpt ? 2 * F * D + F + D : 3 * F * D) * 4;
          off.device_budget = str(one + 256);  // slack for section alignment
        }
        train::Trainer offloaded(model(arch), off, {});
        run(resident, 4);
        run(offloaded, 4);
        require_same(resident, offloaded);
        if (setting.one_slot) REQUIRE(offloaded.expert_store()->stats().device_slots == 1);
      }
    }
  }
}

TEST_CASE("offload: budgets below one expert are refused naming the minimum", "[offload]") {
  train::TrainConfig t = training(2);
  t.offload = "host";
  t.device_budget = "1KiB";
  REQUIRE_THROWS_WITH(train::Trainer(model(Arch::gpt), t, {}),
                      Catch::Contains("--device-budget 1024 bytes is smaller than one expert") &&
                          Catch::Contains("the minimum is"));
  t.device_budget.clear();
  t.host_budget = "1KB";
  REQUIRE_THROWS_WITH(train::Trainer(model(Arch::gpt), t, {}),
                      Catch::Contains("--host-budget") && Catch::Contains("--offload ssd"));
  t.host_budget = "lots";
  REQUIRE_THROWS_WITH(train::Trainer(model(Arch::gpt), t, {}),
                      Catch::Contains("--host-budget 'lots'"));
}

TEST_CASE("offload: resume of an offloaded run equals the uninterrupted run (bitwise)",
          "[offload]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    DYNAMIC_SECTION(dtype_name(dtype)) {
      test::ScratchDir dir("offload-resume");
      train::TrainConfig t = training(6);
      t.offload = "host";
      train::Trainer straight(model(Arch::mixtral, dtype), t, {});
      run(straight, 6);
      train::Trainer first(model(Arch::mixtral, dtype), t, {});
      run(first, 3);
      const std::string path = first.save(dir.path());
      train::Trainer second(model(Arch::mixtral, dtype), t, {});
      second.restore(path);
      run(second, 3);
      require_same(straight, second);
      // The checkpoint is the usual one: a resident run resumes from it, bitwise too.
      train::TrainConfig resident_config = t;
      resident_config.offload = "none";
      train::Trainer resident(model(Arch::mixtral, dtype), resident_config, {});
      resident.restore(path);
      run(resident, 3);
      require_same(straight, resident);
    }
  }
}
