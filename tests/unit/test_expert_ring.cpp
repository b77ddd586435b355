// offload::ExpertRing (expert offload through K slots, an nn::ExpertStore serving whole layers):
// forward passes bitwise equal to the resident model for any budget, overlap on and off, gpt and
// mixtral, f32 and bf16 checkpoints, over consecutive passes; budget errors and parsing;
// statistics; refused checkpoints; loader failures; backward refused; a CUDA ring where no GPU is
// usable (tests/cuda/test_cuda_ring.cpp runs the ring on a GPU).
// Shapes: L MoE layers, K slots, B batch, T sequence.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "moe/cuda.h"
#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "moe/offload/budget.h"
#include "moe/offload/expert_ring.h"
#include "support/ring.h"
#include "support/run.h"

using namespace moe;
using offload::ExpertRing;
using offload::RingConfig;
using offload::RingStats;

using test::moe_layer_bytes;
using test::ring_batch;
using test::ring_config;
using test::same_bytes;
using test::save_ring_model;

TEST_CASE("ring: forward passes are bitwise those of the resident model", "[ring]") {
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const ModelConfig config = ring_config(arch, dtype);
      test::ScratchDir dir("ring-bitwise");
      const std::string path = dir / "model.h5";
      save_ring_model(path, config, 11);
      infer::LoadedModel resident = infer::load_model(path);
      std::vector<test::RingBatch> batches;
      std::vector<Tensor> want_nll;
      std::vector<ForwardStats> want;
      for (uint64_t b = 0; b < 3; ++b) {
        batches.push_back(ring_batch(config, 2, 100 + b));
        Tensor nll;
        want.push_back(resident.model->evaluate(batches.back().ids, batches.back().targets,
                                                EvalOptions{.row_nll = &nll}));
        want_nll.push_back(nll);
      }
      for (int64_t layers_budget : {1, 2, 100}) {
        for (bool overlap : {true, false}) {
          DYNAMIC_SECTION(arch_name(arch) << " " << dtype_name(dtype) << " budget " << layers_budget
                                          << " layers, overlap " << overlap) {
            infer::LoadedModel m = infer::load_ring_model(path);
            ExpertRing& ring = *m.ring;
            const int64_t largest = test::largest_moe_layer_bytes(*resident.params, config.layers);
            REQUIRE(ring.layer_bytes() == largest);
            RingConfig rc;
            rc.budget_bytes = largest * layers_budget + largest / 2;
            rc.overlap = overlap;
            ring.start(rc);
            REQUIRE(ring.slots() == std::min<int64_t>(layers_budget, 4));
            // Two rounds over the batches: consecutive passes keep streaming.
            for (int round = 0; round < 2; ++round) {
              for (size_t b = 0; b < batches.size(); ++b) {
                Tensor nll;
                ForwardStats got = m.model->evaluate(batches[b].ids, batches[b].targets,
                                                     EvalOptions{.row_nll = &nll});
                INFO("round " << round << " batch " << b);
                REQUIRE(same_bytes(nll, want_nll[b]));
                REQUIRE(got.loss == want[b].loss);
                REQUIRE(got.aux_loss == want[b].aux_loss);
                REQUIRE(got.z_loss == want[b].z_loss);
              }
            }
            RingStats s = ring.stats();
            REQUIRE(s.layers_served == 6 * 4);
            REQUIRE(s.layers_loaded >= 4);
          }
        }
      }
    }
  }
}

TEST_CASE("ring: the model's experts are the ring's, nothing of them is allocated", "[ring]") {
  const ModelConfig config = ring_config(Arch::mixtral, DType::bf16);
  test::ScratchDir dir("ring-store");
  const std::string path = dir / "model.h5";
  save_ring_model(path, config, 3);
  infer::LoadedModel resident = infer::load_model(path);
  infer::LoadedModel m = infer::load_ring_model(path);
  REQUIRE(m.ring);
  REQUIRE(m.params->size() == resident.params->size());
  for (const Param* p : std::as_const(*m.params).all()) {
    const Param& want = resident.params->at(p->name);
    REQUIRE(p->expert == want.expert);
    REQUIRE(p->shape == want.value.shape());
    REQUIRE(p->offloaded == p->expert);
    REQUIRE(p->value.defined() != p->expert);
    REQUIRE(!p->grad.defined());  // a loaded model runs forward passes only
    REQUIRE(!want.grad.defined());
  }
  m.params->zero_grad();  // skips what holds no gradient
  m.params->to(Device{});
  REQUIRE(m.ring->moe_layers() == 4);
  REQUIRE(m.ring->layer_bytes() == test::moe_layer_bytes(*resident.params, 0));
  REQUIRE(m.ring->expert_bytes() == 4 * m.ring->layer_bytes());
  REQUIRE(m.ring->slots() == 0);  // not started
  // A forward pass before start() is refused, naming the call to make.
  const test::RingBatch batch = ring_batch(config, 1, 4);
  REQUIRE_THROWS_WITH(m.model->evaluate(batch.ids, batch.targets),
                      Catch::Contains("expert ring: start() it"));
}

TEST_CASE("ring: a backward pass through the ring is refused", "[ring]") {
  const ModelConfig config = ring_config(Arch::gpt, DType::f32);
  test::ScratchDir dir("ring-backward");
  const std::string path = dir / "model.h5";
  save_ring_model(path, config, 6);
  infer::LoadedModel m = infer::load_ring_model(path);
  RingConfig rc;
  rc.budget_bytes = m.ring->expert_bytes();
  m.ring->start(rc);
  const test::RingBatch batch = ring_batch(config, 1, 5);
  REQUIRE_THROWS_WITH(m.model->forward_backward(batch.ids, batch.targets, nn::RouterStep{}),
                      Catch::Contains("forward passes only"));
}

TEST_CASE("ring: a budget below one layer's experts is a usage error", "[ring]") {
  const ModelConfig config = ring_config(Arch::gpt, DType::f32);
  test::ScratchDir dir("ring-budget");
  const std::string path = dir / "model.h5";
  save_ring_model(path, config, 5);
  infer::LoadedModel m = infer::load_ring_model(path);
  const int64_t largest = m.ring->layer_bytes();  // 4 experts, the largest layer
  REQUIRE(largest == moe_layer_bytes(*infer::load_model(path).params, 0));
  RingConfig rc;
  rc.budget_bytes = largest - 1;
  try {
    m.ring->start(rc);
    FAIL("no error");
  } catch (const UsageError& e) {
    REQUIRE(std::string(e.what()) == str("--expert-budget ", largest - 1,
                                         " bytes is smaller than one MoE layer's experts (",
                                         largest, " bytes)"));
  }
  // The refused start leaves the ring as it was: a budget that fits starts it.
  REQUIRE(m.ring->slots() == 0);
  rc.budget_bytes = largest;
  m.ring->start(rc);
  REQUIRE(m.ring->slots() == 1);
}

TEST_CASE("ring: --expert-budget reads bytes, units and shares", "[ring]") {
  auto parse_budget = [](const std::string& text, int64_t total) {
    return offload::parse_bytes("--expert-budget", text, total);
  };
  REQUIRE(parse_budget("123456", 0) == 123456);
  REQUIRE(parse_budget("0", 0) == 0);
  REQUIRE(parse_budget("512MiB", 0) == 512LL << 20);
  REQUIRE(parse_budget("1.5GB", 0) == 1500000000LL);
  REQUIRE(parse_budget("2 KiB", 0) == 2048);
  REQUIRE(parse_budget("3kb", 0) == 3000);
  REQUIRE(parse_budget("1GiB", 0) == 1LL << 30);
  REQUIRE(parse_budget("7B", 0) == 7);
  REQUIRE(parse_budget("1MB", 0) == 1000000);
  REQUIRE(parse_budget("25%", 1000) == 250);
  REQUIRE(parse_budget("12.5%", 1001) == 125);  // rounded down
  REQUIRE(parse_budget(" 100% ", 4096) == 4096);
  // K/M/G/T alone are powers of 1024, as coreutils, dd, Slurm and docker read them (issue 45).
  REQUIRE(parse_budget("256M", 0) == 256LL << 20);
  REQUIRE(parse_budget("3k", 0) == 3072);
  REQUIRE(parse_budget("2G", 0) == 2LL << 30);
  REQUIRE(parse_budget("1.5 m", 0) == 3LL << 19);
  REQUIRE(parse_budget("1T", 0) == 1LL << 40);
  for (const char* bad : {"", "abc", "-5", "12XB", "1e3", "%", "5 % 3", "1..5MB"}) {
    INFO(bad);
    REQUIRE_THROWS_AS(parse_budget(bad, 1000), UsageError);
  }
  REQUIRE_THROWS_WITH(parse_budget("12XB", 0), Catch::Contains("--expert-budget '12XB'") &&
                                                   Catch::Contains("unknown unit 'XB'"));
}

TEST_CASE("ring: stats count slots, loads, reads, cache hits and resident bytes", "[ring]") {
  const ModelConfig config = ring_config(Arch::mixtral, DType::f32);  // L = 4 equal layers
  test::ScratchDir dir("ring-stats");
  const std::string path = dir / "model.h5";
  save_ring_model(path, config, 7);
  const test::RingBatch batch = ring_batch(config, 2, 1);
  for (bool cached : {false, true}) {
    DYNAMIC_SECTION("host cache " << cached) {
      infer::LoadedModel m = infer::load_ring_model(path);
      ExpertRing& ring = *m.ring;
      const int64_t layer = ring.layer_bytes();
      RingConfig rc;
      rc.budget_bytes = 2 * layer + layer / 3;  // K = 2
      rc.host_cache_bytes = cached ? 4 * layer : 0;
      ring.start(rc);
      ring.drain();
      RingStats s = ring.stats();
      REQUIRE(s.slots == 2);
      REQUIRE(s.peak_resident_bytes == 2 * layer);
      REQUIRE(s.layers_loaded == 2);  // the first K layers load at start
      REQUIRE(s.bytes_read == 2 * layer);
      for (int pass = 1; pass <= 3; ++pass) {
        m.model->evaluate(batch.ids, batch.targets);
        ring.drain();
        s = ring.stats();
        // Each pass loads every layer once; its last K layers' slots prefetch the next pass's
        // first K layers.
        REQUIRE(s.layers_loaded == 4 * pass + 2);
        REQUIRE(s.layers_served == 4 * pass);
        REQUIRE(s.bytes_read == (cached ? 4 * layer : (4 * pass + 2) * layer));
        REQUIRE(s.cache_hits == (cached ? 4 * pass + 2 - 4 : 0));
        REQUIRE(s.compute_seconds > 0);
        REQUIRE(s.load_seconds > 0);
        REQUIRE(s.overlap_percent >= 0);
        REQUIRE(s.overlap_percent <= 100);
        REQUIRE(s.peak_resident_bytes == 2 * layer);
      }
      ring.reset_stats();
      s = ring.stats();
      REQUIRE(s.layers_loaded == 0);
      REQUIRE(s.compute_seconds == 0);
      REQUIRE(s.slots == 2);
      REQUIRE(s.peak_resident_bytes == 2 * layer);
    }
  }
  SECTION("a budget of every layer loads each once") {
    infer::LoadedModel m = infer::load_ring_model(path);
    ExpertRing& ring = *m.ring;
    RingConfig rc;
    rc.budget_bytes = int64_t{1} << 40;
    ring.start(rc);
    for (int pass = 0; pass < 3; ++pass) m.model->evaluate(batch.ids, batch.targets);
    ring.drain();
    RingStats s = ring.stats();
    REQUIRE(s.slots == 4);
    REQUIRE(s.layers_loaded == 4);
    REQUIRE(s.peak_resident_bytes == ring.expert_bytes());
  }
  SECTION("on demand: no prefetch, a layer loads when it is reached") {
    infer::LoadedModel m = infer::load_ring_model(path);
    ExpertRing& ring = *m.ring;
    RingConfig rc;
    rc.budget_bytes = ring.layer_bytes();  // K = 1
    rc.overlap = false;
    ring.start(rc);
    ring.drain();
    REQUIRE(ring.stats().layers_loaded == 0);
    for (int pass = 1; pass <= 2; ++pass) {
      m.model->evaluate(batch.ids, batch.targets);
      RingStats s = ring.stats();
      REQUIRE(s.layers_loaded == 4 * pass);
      REQUIRE(s.wait_seconds > 0);
    }
  }
}

TEST_CASE("ring: a checkpoint of another model is refused", "[ring]") {
  test::ScratchDir dir("ring-mismatch");
  const ModelConfig config = ring_config(Arch::mixtral, DType::f32);
  const std::string path = dir / "model.h5";
  save_ring_model(path, config, 9);
  RingConfig rc;
  rc.budget_bytes = int64_t{1} << 40;
  SECTION("another expert width") {
    ModelConfig other = config;
    other.d_ff = 2 * config.d_ff;
    ExpertRing ring(path);
    nn::Parallel view;
    view.expert_store = &ring;
    ParamSet ps(0, other.dtype);
    Transformer model(other, ps, &view);
    REQUIRE_THROWS_WITH(ring.start(rc), Catch::Contains("does not match the model") &&
                                            Catch::Contains("blocks.0.moe.experts.w1") &&
                                            Catch::Contains("[4,64,32]") &&
                                            Catch::Contains("[4,128,32]"));
  }
  SECTION("another architecture (gpt has biases the mixtral checkpoint lacks)") {
    ModelConfig other = test::small_model_config(Arch::gpt);
    other.layers = 4;
    other.seq = 16;
    other.resolve();
    ExpertRing ring(path);
    nn::Parallel view;
    view.expert_store = &ring;
    ParamSet ps(0, other.dtype);
    Transformer model(other, ps, &view);
    REQUIRE_THROWS_WITH(ring.start(rc), Catch::Contains("does not match the model: no tensor") &&
                                            Catch::Contains("blocks.0.moe.experts.b1"));
  }
  SECTION("not a checkpoint") {
    test::write_file(dir / "junk.h5", "not an HDF5 file");
    ExpertRing ring(dir / "junk.h5");
    nn::Parallel view;
    view.expert_store = &ring;
    ParamSet ps(0, config.dtype);
    Transformer model(config, ps, &view);
    REQUIRE_THROWS_AS(ring.start(rc), Error);
  }
}

TEST_CASE("ring: a failed load is thrown by the forward pass that needs the layer", "[ring]") {
  test::ScratchDir dir("ring-fail");
  const ModelConfig config = ring_config(Arch::mixtral, DType::f32);
  const std::string path = dir / "model.h5";
  save_ring_model(path, config, 13);
  infer::LoadedModel m = infer::load_ring_model(path);
  RingConfig rc;
  rc.budget_bytes = m.ring->layer_bytes();
  rc.overlap = false;  // nothing loads before the first pass
  m.ring->start(rc);
  std::filesystem::remove(path);
  const test::RingBatch batch = ring_batch(config, 1, 2);
  REQUIRE_THROWS_WITH(
      m.model->evaluate(batch.ids, batch.targets),
      Catch::Contains("expert ring: loading MoE layer 0 (block 0)") && Catch::Contains("model.h5"));
  // The ring stays usable once the file is back.
  save_ring_model(path, config, 13);
  infer::LoadedModel resident = infer::load_model(path);
  Tensor want, got;
  resident.model->evaluate(batch.ids, batch.targets, EvalOptions{.row_nll = &want});
  m.model->evaluate(batch.ids, batch.targets, EvalOptions{.row_nll = &got});
  REQUIRE(same_bytes(got, want));
}

TEST_CASE("ring: a CUDA ring needs a usable CUDA device", "[ring]") {
  test::ScratchDir dir("ring-cuda");
  const ModelConfig config = ring_config(Arch::mixtral, DType::f32);
  const std::string path = dir / "model.h5";
  save_ring_model(path, config, 17);
  infer::LoadedModel m = infer::load_ring_model(path);
  RingConfig rc;
  rc.budget_bytes = m.ring->layer_bytes();
  // A device index past the visible ones is refused in every build, before anything is allocated.
  rc.device = Device{Device::cuda, 4096};
  REQUIRE_THROWS_WITH(m.ring->start(rc), Catch::StartsWith("expert ring: device cuda:4096"));
  REQUIRE(m.ring->slots() == 0);
  rc.device = Device{Device::cuda, 0};
  if (!cuda::available()) {
    // No CUDA backend in this build, or no usable GPU: the message says which.
    REQUIRE_THROWS_WITH(m.ring->start(rc), Catch::StartsWith("expert ring: device cuda:0: " +
                                                             cuda::unavailable_reason()));
    REQUIRE(m.ring->slots() == 0);
  } else {
    m.ring->start(rc);
    REQUIRE(m.ring->slots() == 1);
  }
}
