// [cuda] offload::ExpertRing with its slots on a GPU: pinned staging, a copy stream and events in
// place of host waits. Forward passes give bitwise the resident GPU model's per-token NLL and
// losses for K = 1, 2 and L slots, overlap on and off, gpt and mixtral, f32 and bf16 checkpoints,
// over consecutive passes; the experts are the ring's (offloaded Params ParamSet::to leaves alone).
// Shapes: L MoE layers, K slots, B batch, T sequence.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "moe/cuda.h"
#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "moe/offload/expert_ring.h"
#include "support/cuda.h"
#include "support/ring.h"
#include "support/run.h"

using namespace moe;
using offload::ExpertRing;
using offload::RingConfig;
using offload::RingStats;

using test::largest_moe_layer_bytes;
using test::RingBatch;
using test::same_bytes;
using test::save_ring_model;

namespace {

const Device kGpu{Device::cuda, 0};

// test::ring_config with the aux and z losses on, so that their values are compared too.
ModelConfig gpu_ring_config(Arch arch, DType dtype) {
  ModelConfig c = test::ring_config(arch, dtype);
  c.aux_loss_coef = 0.01;
  c.z_loss_coef = 0.001;
  return c;
}

RingBatch gpu_batch(const ModelConfig& c, int64_t B, uint64_t seed) {
  return test::ring_batch(c, B, seed, kGpu);
}

}  // namespace

TEST_CASE("cuda: ring-served experts on the GPU are bitwise the resident GPU model", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const ModelConfig config = gpu_ring_config(arch, dtype);
      test::ScratchDir dir("cuda-ring-bitwise");
      const std::string path = dir / "model.h5";
      save_ring_model(path, config, 21);
      infer::LoadedModel resident = infer::load_model(path);
      resident.params->to(kGpu);
      std::vector<RingBatch> batches;
      std::vector<Tensor> want_nll;
      std::vector<ForwardStats> want;
      for (uint64_t b = 0; b < 3; ++b) {
        batches.push_back(gpu_batch(config, 2, 300 + b));
        Tensor nll;
        want.push_back(resident.model->evaluate(batches.back().ids, batches.back().targets,
                                                EvalOptions{.row_nll = &nll}));
        REQUIRE(nll.device() == kGpu);
        want_nll.push_back(nll.to(Device{}));
      }
      for (int64_t layers_budget : {1, 2, 4}) {  // 4 = L: every layer stays resident
        for (bool overlap : {true, false}) {
          DYNAMIC_SECTION(arch_name(arch) << " " << dtype_name(dtype) << " K " << layers_budget
                                          << " overlap " << overlap) {
            infer::LoadedModel m = infer::load_ring_model(path);
            ExpertRing& ring = *m.ring;
            const int64_t largest = largest_moe_layer_bytes(*resident.params, config.layers);
            REQUIRE(ring.layer_bytes() == largest);
            RingConfig rc;
            rc.budget_bytes = largest * layers_budget + largest / 2;
            rc.overlap = overlap;
            rc.device = kGpu;
            ring.start(rc);
            m.params->to(kGpu);  // the non-expert parameters; the experts are the ring's
            REQUIRE(ring.slots() == layers_budget);
            REQUIRE(m.model->device() == kGpu);
            for (const Param* p : std::as_const(*m.params).all()) {
              INFO(p->name);
              REQUIRE(p->offloaded == p->expert);
              if (!p->expert) REQUIRE(p->value.device() == kGpu);
            }
            for (int round = 0; round < 2; ++round) {
              for (size_t b = 0; b < batches.size(); ++b) {
                Tensor nll;
                ForwardStats got = m.model->evaluate(batches[b].ids, batches[b].targets,
                                                     EvalOptions{.row_nll = &nll});
                INFO("round " << round << " batch " << b);
                REQUIRE(nll.device() == kGpu);
                REQUIRE(same_bytes(nll, want_nll[b]));
                REQUIRE(got.loss == want[b].loss);
                REQUIRE(got.aux_loss == want[b].aux_loss);
                REQUIRE(got.z_loss == want[b].z_loss);
              }
            }
            ring.drain();
            RingStats s = ring.stats();
            REQUIRE(s.layers_served == 6 * 4);
            REQUIRE(s.layers_loaded >= 4);
            REQUIRE(s.peak_resident_bytes == layers_budget * largest);
            REQUIRE(s.load_seconds > 0);
          }
        }
      }
    }
  }
}

TEST_CASE("cuda: the GPU ring's slots are device memory, the model's on-demand passes match",
          "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const ModelConfig config = gpu_ring_config(Arch::mixtral, DType::f32);
  test::ScratchDir dir("cuda-ring-memory");
  const std::string path = dir / "model.h5";
  save_ring_model(path, config, 5);
  const RingBatch batch = gpu_batch(config, 3, 9);
  infer::LoadedModel resident = infer::load_model(path);
  resident.params->to(kGpu);
  Tensor want;
  resident.model->evaluate(batch.ids, batch.targets, EvalOptions{.row_nll = &want});

  infer::LoadedModel m = infer::load_ring_model(path);
  ExpertRing& ring = *m.ring;
  const int64_t layer = ring.layer_bytes();
  RingConfig rc;
  rc.budget_bytes = 2 * layer;  // K = 2
  rc.device = kGpu;
  const size_t in_use_before = cuda::memory_stats(0).in_use;
  ring.start(rc);
  // Two slots of the allocator's rounded size, at least their bytes.
  REQUIRE(cuda::memory_stats(0).in_use >= in_use_before + static_cast<size_t>(2 * layer));
  ring.drain();
  REQUIRE(ring.stats().layers_loaded == 2);  // the first K layers load at start
  m.params->to(kGpu);
  for (int pass = 1; pass <= 3; ++pass) {
    Tensor got;
    m.model->evaluate(batch.ids, batch.targets, EvalOptions{.row_nll = &got});
    INFO("pass " << pass);
    REQUIRE(same_bytes(got, want));
    ring.drain();
    REQUIRE(ring.stats().layers_loaded == 4 * pass + 2);
  }
}

TEST_CASE("cuda: the non-expert parameters may move to the GPU before the ring starts", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const ModelConfig config = gpu_ring_config(Arch::mixtral, DType::f32);
  test::ScratchDir dir("cuda-ring-order");
  const std::string path = dir / "model.h5";
  save_ring_model(path, config, 6);
  infer::LoadedModel m = infer::load_ring_model(path);
  m.params->to(kGpu);  // the experts are the ring's: ParamSet::to leaves them alone
  RingConfig rc;
  rc.budget_bytes = int64_t{1} << 40;
  rc.device = kGpu;
  m.ring->start(rc);
  REQUIRE(m.ring->slots() == 4);
  const RingBatch batch = gpu_batch(config, 2, 4);
  infer::LoadedModel resident = infer::load_model(path);
  resident.params->to(kGpu);
  Tensor want, got;
  resident.model->evaluate(batch.ids, batch.targets, EvalOptions{.row_nll = &want});
  m.model->evaluate(batch.ids, batch.targets, EvalOptions{.row_nll = &got});
  REQUIRE(same_bytes(got, want));
}
