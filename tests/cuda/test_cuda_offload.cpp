// [cuda] Offloaded training on a GPU (the tiered store with StoreConfig::device = cuda: device
// slots filled from pinned staging buffers on the store's copy stream, device gradient buffers
// downloaded to the records, CPU AdamW) against resident training on the same GPU, gpt and
// mixtral, a few steps: host and SSD tiers, pinning on and off, prefetch 0 and 2, --grad-accum 2,
// one device slot, clipped and overlapped updates; and a resume.
//
// Why bitwise. Each expert runs as a group of one through the same CUDA grouped ops: the grouped
// GEMM issues one cublasSgemm per segment with that segment's m, n, k, leading dimensions and
// beta only (backend/cuda/grouped_gemm.cu), so a group of one is the same call as the whole
// layer's segment, on weights at 64-byte aligned slot offsets where the resident slice is at
// least 16-byte aligned here (F*D a multiple of 4); the bias and activation kernels work per
// element or per (expert, column) over the segment's rows. The expert AdamW runs on the CPU, the
// resident one in the CUDA kernel: the same body, compiled without FMA contraction on both sides
// (libmoe/CMakeLists.txt), with IEEE division and sqrtf. One number is not bitwise: the global
// norm's expert share is summed per expert on the host (the store) against one device reduction
// over the whole tensor (resident), both in double, so the norms agree to ~1e-15 relative and
// the float clip factor differs only when the norm sits within that of a float rounding
// boundary (never for these seeds; a failure here names the step and both norms).
// Shapes: E experts per layer, F expert hidden width, D model width.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "moe/cuda.h"
#include "moe/io/checkpoint.h"
#include "moe/train/trainer.h"
#include "support/cuda.h"
#include "support/models.h"
#include "support/run.h"
#include "support/state.h"
#include "support/training.h"

using namespace moe;

namespace {

const Device kGpu{Device::cuda, 0};

ModelConfig model(Arch arch, DType dtype = DType::f32) { return test::routed_model(arch, dtype); }

train::TrainConfig training(int64_t steps) { return test::short_run(steps); }

// A trainer on the GPU, as moe-train --device cuda builds it (the store's device from the
// constructor, the resident parameters moved after).
std::unique_ptr<train::Trainer> on_gpu(const ModelConfig& mc, const train::TrainConfig& t,
                                       const std::string& resume = "") {
  auto trainer = std::make_unique<train::Trainer>(mc, t, io::Provenance{}, nullptr, kGpu);
  if (!resume.empty()) trainer->restore(resume);
  trainer->to_device(kGpu);
  return trainer;
}

// Every tensor of the run on the host (resident GPU parameters are device tensors).
io::Checkpoint host_snapshot(const train::Trainer& t) {
  io::Checkpoint c = t.snapshot();
  for (std::vector<io::NamedTensor>* group : {&c.params, &c.optim})
    for (io::NamedTensor& nt : *group) nt.tensor = nt.whole().to(Device{});
  return c;
}

void require_same(const train::Trainer& a, const train::Trainer& b) {
  const std::string where = test::first_difference(host_snapshot(a), host_snapshot(b));
  INFO("first difference: " << where);
  REQUIRE(where.empty());
}

// Runs both for `steps`: equal losses every step, norms within double rounding (see the top).
void run_both(train::Trainer& resident, train::Trainer& offloaded, int steps) {
  for (int i = 0; i < steps; ++i) {
    const train::StepStats a = resident.step(), b = offloaded.step();
    INFO("step " << i + 1 << ": norms " << a.grad_norm << " and " << b.grad_norm);
    REQUIRE(a.forward.total == b.forward.total);
    REQUIRE(b.grad_norm == Approx(a.grad_norm).epsilon(1e-12));
  }
}

int64_t slot_bytes(Arch arch) {
  train::TrainConfig t = training(1);
  t.offload.tier = offload::Tier::host;
  const train::Trainer probe(model(arch), t, {});  // the CPU store lays slots out the same way
  return probe.expert_store()->stats().slot_bytes;
}

}  // namespace

TEST_CASE("cuda: offloaded training on the GPU is bitwise the resident GPU run", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (double clip : {1.0, 0.0}) {
        DYNAMIC_SECTION(arch_name(arch) << " " << dtype_name(dtype) << " clip " << clip) {
          train::TrainConfig base = training(4);
          base.clip = clip;
          auto resident = on_gpu(model(arch, dtype), base);
          train::TrainConfig off = base;
          off.offload.tier = offload::Tier::host;
          auto offloaded = on_gpu(model(arch, dtype), off);
          REQUIRE(offloaded->expert_store() != nullptr);
          REQUIRE(offloaded->expert_store()->config().device == kGpu);
          run_both(*resident, *offloaded, 4);
          require_same(*resident, *offloaded);
          const offload::StoreStats st = offloaded->expert_store()->stats();
          REQUIRE(st.uploads > 0);
          if (clip == 0)
            REQUIRE(st.optimizer_overlapped > 0);
          else
            REQUIRE(st.optimizer_overlapped == 0);
        }
      }
    }
  }
}

TEST_CASE("cuda: every store setting on the GPU trains bitwise as resident", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  struct Setting {
    const char* name;
    void (*apply)(train::TrainConfig&);
    bool one_slot = false;  // a device budget of exactly one expert
  };
  const Setting settings[] = {
      {"one device slot", [](train::TrainConfig&) {}, true},
      {"no prefetch", [](train::TrainConfig& t) { t.offload.prefetch_depth = 0; }},
      {"prefetch 2", [](train::TrainConfig& t) { t.offload.prefetch_depth = 2; }},
      {"no pinning", [](train::TrainConfig& t) { t.offload.pin_fraction = 0; }},
      {"all pinned", [](train::TrainConfig& t) { t.offload.pin_fraction = 1; }},
      {"optimizer after backward",
       [](train::TrainConfig& t) { t.offload.optimizer_overlap = false; }},
      {"grad-accum 2", [](train::TrainConfig& t) { t.grad_accum = 2; }},
      {"grad-accum 2, clipped",
       [](train::TrainConfig& t) {
         t.grad_accum = 2;
         t.clip = 1.0;
       }},
      {"recompute moe", [](train::TrainConfig& t) { t.recompute = nn::Recompute::moe; }},
  };
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    for (const Setting& setting : settings) {
      DYNAMIC_SECTION(arch_name(arch) << ": " << setting.name) {
        train::TrainConfig base = training(4);
        base.clip = 0;  // the optimizer overlaps backward
        setting.apply(base);
        auto resident = on_gpu(model(arch), base);
        train::TrainConfig off = base;
        off.offload.tier = offload::Tier::host;
        if (setting.one_slot) off.offload.device_budget = str(slot_bytes(arch));
        auto offloaded = on_gpu(model(arch), off);
        run_both(*resident, *offloaded, 4);
        require_same(*resident, *offloaded);
        if (setting.one_slot) REQUIRE(offloaded->expert_store()->stats().device_slots == 1);
      }
    }
  }
}

TEST_CASE("cuda: the SSD tier on the GPU trains bitwise as resident", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  struct Case {
    Arch arch;
    DType dtype;
    const char* cache;
    double clip;
    int64_t accum;
    int prefetch;
  };
  const Case cases[] = {
      {Arch::gpt, DType::f32, "lru", 1.0, 1, 2},
      {Arch::mixtral, DType::f32, "lfu", 0.0, 2, 0},
      {Arch::mixtral, DType::bf16, "lru", 0.0, 1, 2},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(arch_name(c.arch)
                    << " " << dtype_name(c.dtype) << " " << c.cache << " clip " << c.clip
                    << " accum " << c.accum << " prefetch " << c.prefetch) {
      test::ScratchDir dir("cuda-offload-ssd");
      train::TrainConfig base = training(4);
      base.clip = c.clip;
      base.grad_accum = c.accum;
      auto resident = on_gpu(model(c.arch, c.dtype), base);
      train::TrainConfig off = base;
      off.offload.tier = offload::Tier::ssd;
      off.offload.ssd_dir = dir.path();
      off.offload.expert_cache = offload::parse_cache_policy(c.cache);
      off.offload.prefetch_depth = c.prefetch;
      auto offloaded = on_gpu(model(c.arch, c.dtype), off);  // a host cache of 1/4 of the state
      run_both(*resident, *offloaded, 4);
      require_same(*resident, *offloaded);
      const offload::StoreStats st = offloaded->expert_store()->stats();
      REQUIRE(st.cache.misses > 0);
      REQUIRE(st.ssd_bytes_read > 0);
    }
  }
}

TEST_CASE("cuda: resume of an offloaded GPU run equals the uninterrupted run (bitwise)", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  for (DType dtype : {DType::f32, DType::bf16}) {
    DYNAMIC_SECTION(dtype_name(dtype)) {
      test::ScratchDir dir("cuda-offload-resume");
      train::TrainConfig t = training(6);
      t.offload.tier = offload::Tier::host;
      auto straight = on_gpu(model(Arch::mixtral, dtype), t);
      for (int i = 0; i < 6; ++i) straight->step();
      auto first = on_gpu(model(Arch::mixtral, dtype), t);
      for (int i = 0; i < 3; ++i) first->step();
      const std::string path = first->save(dir.path());
      auto second = on_gpu(model(Arch::mixtral, dtype), t, path);
      REQUIRE(second->steps_done() == 3);
      for (int i = 0; i < 3; ++i) second->step();
      require_same(*straight, *second);
    }
  }
}

TEST_CASE("cuda: a store built for the CPU refuses to train on the GPU, naming both", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  train::TrainConfig t = training(2);
  t.offload.tier = offload::Tier::host;
  train::Trainer trainer(model(Arch::gpt), t, {});  // the CPU store
  REQUIRE_THROWS_WITH(trainer.to_device(kGpu),
                      Catch::Contains("built for cpu") && Catch::Contains("--device cuda:0"));
}
