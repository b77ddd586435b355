// Offloaded training (the tiered ExpertStore, --offload) against resident training: the same
// flags give bitwise the same parameters and optimizer state, whatever the tier, budgets,
// pinning, prefetch, optimizer overlap, gradient accumulation or recomputation.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "moe/cuda.h"
#include "moe/io/checkpoint.h"
#include "moe/train/offload_report.h"
#include "moe/train/trainer.h"
#include "support/models.h"
#include "support/run.h"
#include "support/state.h"
#include "support/training.h"

using namespace moe;

namespace {

ModelConfig model(Arch arch, DType dtype = DType::f32) { return test::routed_model(arch, dtype); }

train::TrainConfig training(int64_t steps) { return test::short_run(steps); }

// Every parameter and optimizer tensor, by name, bitwise.
void require_same(const train::Trainer& a, const train::Trainer& b) {
  const std::string where = test::first_difference(a.snapshot(), b.snapshot());
  INFO("first difference: " << where);
  REQUIRE(where.empty());
}

void run(train::Trainer& t, int steps, std::vector<double>* losses = nullptr) {
  for (int i = 0; i < steps; ++i) {
    const train::StepStats s = t.step();
    if (losses) losses->push_back(s.forward.total);
  }
}

// Bytes of one expert's state in the store (its record) and of one expert's fp32 weights (a device
// slot), as a host-tier store of this model lays them out: what budgets of n experts must hold.
struct ExpertBytes {
  int64_t record = 0, slot = 0;
};
ExpertBytes expert_bytes(Arch arch, DType dtype = DType::f32) {
  const ModelConfig mc = model(arch, dtype);
  train::TrainConfig t = training(1);
  t.offload.tier = offload::Tier::host;
  const train::Trainer probe(mc, t, {});
  const offload::StoreStats s = probe.expert_store()->stats();
  return {s.record_bytes / (mc.num_moe_layers() * mc.experts), s.slot_bytes};
}

int64_t record_bytes(Arch arch, DType dtype) { return expert_bytes(arch, dtype).record; }

}  // namespace

TEST_CASE("offload: host tier trains bitwise as resident (gpt and mixtral, f32 and bf16)",
          "[offload]") {
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (double clip : {1.0, 0.0}) {
        DYNAMIC_SECTION(arch_name(arch) << " " << dtype_name(dtype) << " clip " << clip) {
          train::TrainConfig base = training(5);
          base.clip = clip;
          train::Trainer resident(model(arch, dtype), base, {});
          train::TrainConfig off = base;
          off.offload.tier = offload::Tier::host;
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
      {"no prefetch", [](train::TrainConfig& t) { t.offload.prefetch_depth = 0; }},
      {"deep prefetch", [](train::TrainConfig& t) { t.offload.prefetch_depth = 8; }},
      {"no pinning", [](train::TrainConfig& t) { t.offload.pin_fraction = 0; }},
      {"all pinned", [](train::TrainConfig& t) { t.offload.pin_fraction = 1; }},
      {"optimizer after backward",
       [](train::TrainConfig& t) { t.offload.optimizer_overlap = false; }},
      {"grad-accum 2", [](train::TrainConfig& t) { t.grad_accum = 2; }},
      {"recompute moe", [](train::TrainConfig& t) { t.recompute = nn::Recompute::moe; }},
      {"recompute block", [](train::TrainConfig& t) { t.recompute = nn::Recompute::block; }},
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
        off.offload.tier = offload::Tier::host;
        if (setting.one_slot)  // exactly one slot: one expert's fp32 weights
          off.offload.device_budget = str(expert_bytes(arch).slot);
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
  t.offload.tier = offload::Tier::host;
  t.offload.device_budget = "1KiB";
  REQUIRE_THROWS_WITH(train::Trainer(model(Arch::gpt), t, {}),
                      Catch::Contains("--device-budget 1024 bytes is smaller than one expert") &&
                          Catch::Contains("the minimum is"));
  t.offload.device_budget.clear();
  t.offload.host_budget = "1KB";
  REQUIRE_THROWS_WITH(train::Trainer(model(Arch::gpt), t, {}),
                      Catch::Contains("--host-budget") && Catch::Contains("--offload ssd"));
  t.offload.host_budget = "lots";
  REQUIRE_THROWS_WITH(train::Trainer(model(Arch::gpt), t, {}),
                      Catch::Contains("--host-budget 'lots'"));
}

TEST_CASE("offload: resume of an offloaded run equals the uninterrupted run (bitwise)",
          "[offload]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    DYNAMIC_SECTION(dtype_name(dtype)) {
      test::ScratchDir dir("offload-resume");
      train::TrainConfig t = training(6);
      t.offload.tier = offload::Tier::host;
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
      resident_config.offload.tier = offload::Tier::none;
      train::Trainer resident(model(Arch::mixtral, dtype), resident_config, {});
      resident.restore(path);
      run(resident, 3);
      require_same(straight, resident);
    }
  }
}

TEST_CASE("offload: the SSD tier trains bitwise as resident (LRU, LFU, bypass)", "[offload]") {
  struct Case {
    Arch arch;
    DType dtype;
    const char* cache;
    double clip;
    int64_t records;  // host cache, in records
    int64_t accum;
  };
  const Case cases[] = {
      {Arch::gpt, DType::f32, "lru", 1.0, 3, 1},     {Arch::gpt, DType::f32, "lfu", 0.0, 3, 1},
      {Arch::mixtral, DType::f32, "lru", 0.0, 1, 1}, {Arch::mixtral, DType::bf16, "lfu", 1.0, 5, 2},
      {Arch::gpt, DType::bf16, "lru", 0.0, 2, 2},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(arch_name(c.arch)
                    << " " << dtype_name(c.dtype) << " " << c.cache << " clip " << c.clip
                    << " cache of " << c.records << " accum " << c.accum) {
      test::ScratchDir dir("offload-ssd");
      train::TrainConfig base = training(4);
      base.clip = c.clip;
      base.grad_accum = c.accum;
      train::Trainer resident(model(c.arch, c.dtype), base, {});
      train::TrainConfig off = base;
      off.offload.tier = offload::Tier::ssd;
      off.offload.ssd_dir = dir.path();
      off.offload.expert_cache = offload::parse_cache_policy(c.cache);
      off.offload.lfu.period = 2;
      off.offload.host_budget = str(c.records * record_bytes(c.arch, c.dtype) + 1024);
      train::Trainer offloaded(model(c.arch, c.dtype), off, {});
      run(resident, 4);
      run(offloaded, 4);
      require_same(resident, offloaded);
      const offload::StoreStats st = offloaded.expert_store()->stats();
      INFO("host bytes " << st.host_bytes << ", ssd read " << st.ssd_bytes_read);
      REQUIRE(st.cache.misses > 0);
      REQUIRE(st.ssd_bytes_read > 0);
      REQUIRE(st.ssd_bytes_written > 0);
      REQUIRE(st.ssd_read_seconds > 0);
      REQUIRE(st.ssd_write_seconds > 0);
      REQUIRE(st.host_bytes <= (c.records + 3) * record_bytes(c.arch, c.dtype));
    }
  }
}

TEST_CASE("offload: SSD tier errors are clear", "[offload]") {
  test::ScratchDir dir("offload-ssd-errors");
  train::TrainConfig t = training(2);
  t.offload.tier = offload::Tier::ssd;
  REQUIRE_THROWS_WITH(train::Trainer(model(Arch::gpt), t, {}), Catch::Contains("--ssd-dir"));
  // Under a regular file: not a directory anyone can create.
  const std::string file = dir.path() + "/plain";
  { std::ofstream(file) << "x"; }
  t.offload.ssd_dir = file + "/cache";
  REQUIRE_THROWS_WITH(train::Trainer(model(Arch::gpt), t, {}), Catch::Contains("--ssd-dir"));
  t.offload.ssd_dir = dir.path();
  t.offload.host_budget = "100";
  REQUIRE_THROWS_WITH(train::Trainer(model(Arch::gpt), t, {}),
                      Catch::Contains("--host-budget 100 bytes is smaller than one expert") &&
                          Catch::Contains("the minimum is"));
}

TEST_CASE("offload: a damaged SSD expert file stops the run clearly, the checkpoint survives",
          "[offload]") {
  namespace fs = std::filesystem;
  test::ScratchDir ssd("offload-ssd-damage"), out("offload-ssd-damage-out");
  train::TrainConfig t = training(4);
  t.offload.tier = offload::Tier::ssd;
  t.offload.ssd_dir = ssd.path();
  t.offload.host_budget = str(2 * record_bytes(Arch::gpt, DType::f32) + 1024);
  train::Trainer trainer(model(Arch::gpt), t, {});
  run(trainer, 2);
  const std::string saved = trainer.save(out.path());
  // Flip one payload byte of every expert file (past the 4096-byte header).
  int damaged = 0;
  for (const auto& entry : fs::recursive_directory_iterator(ssd.path())) {
    if (entry.path().extension() != ".bin") continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(4096 + 100);
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x5a);
    f.seekp(4096 + 100);
    f.write(&byte, 1);
    ++damaged;
  }
  REQUIRE(damaged > 0);
  REQUIRE_THROWS_WITH(run(trainer, 2), Catch::Contains("expert") && Catch::Contains("checksum"));
  // The checkpoint written before is whole and resumes (into a fresh SSD cache).
  train::Trainer resumed(model(Arch::gpt), t, {});
  resumed.restore(saved);
  REQUIRE(resumed.steps_done() == 2);
  run(resumed, 1);
}

TEST_CASE("offload: auto keeps everything resident when it fits, else picks SSD, else refuses",
          "[offload]") {
  test::ScratchDir ssd("offload-auto");
  train::TrainConfig t = training(2);
  t.offload.tier = offload::Tier::automatic;
  {  // this small model fits the machine's memory: no store at all
    train::Trainer fits(model(Arch::gpt), t, {});
    REQUIRE(fits.expert_store() == nullptr);
  }
  // The whole state is about 1.05 MB (experts 0.52 MB, dense state and logits 0.53 MB): a
  // "device" of 800 kB holds the dense state and a few expert slots but not every expert, and
  // without an SSD nothing fits.
  t.offload.device_budget = "800KB";
  REQUIRE_THROWS_WITH(train::Trainer(model(Arch::gpt), t, {}),
                      Catch::Contains("--offload auto") && Catch::Contains("--ssd-dir"));
  t.offload.ssd_dir = ssd.path();
  train::Trainer on_ssd(model(Arch::gpt), t, {});
  REQUIRE(on_ssd.expert_store() != nullptr);
  REQUIRE(on_ssd.expert_store()->config().tier == offload::Tier::ssd);
  train::TrainConfig resident_config = training(2);
  train::Trainer resident(model(Arch::gpt), resident_config, {});
  run(resident, 2);
  run(on_ssd, 2);
  require_same(resident, on_ssd);
  // A device too small for even the dense state is refused naming the shortfall.
  t.offload.device_budget = "64KiB";
  REQUIRE_THROWS_WITH(train::Trainer(model(Arch::gpt), t, {}),
                      Catch::Contains("dense state alone") && Catch::Contains("short"));
}

TEST_CASE("offload: experts routed only in an earlier micro-batch keep their gradient (clipped)",
          "[offload]") {
  // Micro-batches of one sequence: some experts get rows in an early micro-batch and none in
  // the last, so their gradient is completed after backward; a tight clip makes the global norm
  // (and so every expert's contribution to it) decide every update.
  for (const char* tier : {"host", "ssd"}) {
    DYNAMIC_SECTION(tier) {
      test::ScratchDir ssd("offload-accum");
      train::TrainConfig base = training(4);
      base.batch = 4;
      base.grad_accum = 4;
      base.clip = 0.05;
      ModelConfig mc = model(Arch::mixtral);
      mc.experts = 16;
      mc.seq = 4;  // 8 assignments per micro-batch over 16 experts
      mc.resolve();
      train::Trainer resident(mc, base, {});
      train::TrainConfig off = base;
      off.offload.tier = offload::parse_tier(tier);
      off.offload.ssd_dir = ssd.path();
      train::Trainer offloaded(mc, off, {});
      for (int i = 0; i < 4; ++i) {
        const train::StepStats a = resident.step(), b = offloaded.step();
        REQUIRE(a.grad_norm > base.clip);  // clipping on every step
        REQUIRE(a.grad_norm == b.grad_norm);
      }
      require_same(resident, offloaded);
    }
  }
}

TEST_CASE("offload: the GPU store is one process only, and needs a usable GPU", "[offload]") {
  // Several ranks are refused before the device is opened, as a usage error naming the flags.
  train::TrainConfig t = training(2);
  t.offload.tier = offload::Tier::host;
  const Device gpu{Device::cuda, 0};
  REQUIRE_THROWS_AS(train::check_offload_device(t, gpu, 2), UsageError);
  REQUIRE_THROWS_WITH(train::check_offload_device(t, gpu, 2),
                      Catch::Contains("--offload host with --device cuda:0 on 2 ranks") &&
                          Catch::Contains("one process only"));
  REQUIRE_NOTHROW(train::check_offload_device(t, gpu, 1));
  REQUIRE_NOTHROW(train::check_offload_device(t, Device{}, 2));
  t.offload.tier = offload::Tier::none;
  REQUIRE_NOTHROW(train::check_offload_device(t, gpu, 2));
  // The library refuses a store on a GPU it cannot use with the driver's (or the build's) reason.
  if (cuda::available()) return;  // tests/cuda/test_cuda_offload.cpp trains there
  t.offload.tier = offload::Tier::host;
  REQUIRE_THROWS_WITH(train::Trainer(model(Arch::gpt), t, {}, nullptr, gpu),
                      Catch::Contains("cuda:0") && Catch::Contains(cuda::unavailable_reason()));
}

// The GPU store's own logic (StoreConfig::stage_on_host): staging buffers, gradient buffers that
// start as zero or as the expert's gradient so far this step, downloads drained into the records
// on the optimizer thread, complete_gradients waiting for them. On the CPU the copies are
// synchronous, so this checks the bookkeeping, not the GPU's ordering ([cuda] tests do that).
TEST_CASE("offload: the GPU store's path staged on the host trains bitwise as resident",
          "[offload]") {
  struct Case {
    Arch arch;
    DType dtype;
    const char* tier;
    double clip;
    int64_t accum;
    int prefetch;
    double pin;
    bool one_slot;
  };
  const Case cases[] = {
      {Arch::gpt, DType::f32, "host", 1.0, 1, 2, 0.25, false},
      {Arch::gpt, DType::bf16, "host", 0.0, 2, 0, 0.0, true},
      {Arch::mixtral, DType::f32, "host", 0.0, 1, 2, 1.0, false},
      {Arch::mixtral, DType::f32, "ssd", 1.0, 2, 2, 0.25, false},
      {Arch::mixtral, DType::bf16, "ssd", 0.0, 2, 0, 0.0, true},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(arch_name(c.arch)
                    << " " << dtype_name(c.dtype) << " " << c.tier << " clip " << c.clip
                    << " accum " << c.accum << " prefetch " << c.prefetch << " pin " << c.pin
                    << " one slot " << c.one_slot) {
      test::ScratchDir dir("offload-staged");
      train::TrainConfig base = training(4);
      base.clip = c.clip;
      base.grad_accum = c.accum;
      train::Trainer resident(model(c.arch, c.dtype), base, {});
      train::TrainConfig off = base;
      off.offload.tier = offload::parse_tier(c.tier);
      off.offload.ssd_dir = dir.path();
      off.offload.prefetch_depth = c.prefetch;
      off.offload.pin_fraction = c.pin;
      if (c.one_slot) off.offload.device_budget = str(expert_bytes(c.arch, c.dtype).slot);
      off.offload.stage_on_host = true;
      train::Trainer offloaded(model(c.arch, c.dtype), off, {});
      for (int i = 0; i < 4; ++i) {
        const train::StepStats a = resident.step(), b = offloaded.step();
        REQUIRE(a.forward.total == b.forward.total);
        REQUIRE(a.grad_norm == b.grad_norm);
      }
      require_same(resident, offloaded);
      const offload::StoreStats st = offloaded.expert_store()->stats();
      REQUIRE(st.uploads > 0);
      if (c.clip == 0)
        REQUIRE(st.optimizer_overlapped > 0);
      else
        REQUIRE(st.optimizer_overlapped == 0);
      if (c.one_slot) REQUIRE(st.device_slots == 1);
    }
  }
}
