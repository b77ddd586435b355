// Aux-loss-free balancing (issue 21, DeepSeek-V3): the selection bias update from hand-made loads
// (the exact change, sign(0) = 0), AdamW leaving the frozen bias bitwise alone, a training step
// applying exactly the update its loads call for, and a checkpoint carrying the bias through a
// resume. Shapes: E experts.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "moe/io/checkpoint.h"
#include "moe/nn/router.h"
#include "moe/optim/adamw.h"
#include "moe/rng.h"
#include "moe/train/trainer.h"
#include "support/gradcheck.h"
#include "support/run.h"
#include "support/state.h"
#include "support/training.h"

using namespace moe;
using namespace moe::nn;

namespace {

RouterConfig biased_router(int64_t experts) {
  RouterConfig rc;
  rc.d_model = 6;
  rc.num_experts = experts;
  rc.top_k = 2;
  rc.scoring = RouterScoring::sigmoid;
  rc.selection_bias = true;
  return rc;
}

std::vector<float> host_values(const Param& p) { return p.value.to(Device{}).to_vector(); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

ModelConfig balanced_model() {
  ModelConfig m = test::small_model_config(Arch::mixtral);
  m.router_scoring = RouterScoring::sigmoid;
  m.balance_bias_rate = 0.01;
  m.aux_loss_coef = 0;
  m.shared_expert_ff = 24;
  m.resolve();
  return m;
}

std::string bias_name(int64_t block) { return str("blocks.", block, ".moe.router.bias"); }

}  // namespace

TEST_CASE("balance: the bias update from hand-made loads is exact, sign(0) = 0", "[balance_bias]") {
  ParamSet ps(1);
  Router router(ps, "blocks.0.moe.router", biased_router(5));
  Param& b = *router.selection_bias();
  REQUIRE(b.frozen);
  REQUIRE_FALSE(b.decay);
  REQUIRE(host_values(b) == std::vector<float>(5, 0.0f));  // starts at zero
  b.value.copy_from(Tensor::from_vector({5}, std::vector<float>{0.5f, -0.25f, 0.0f, 1.0f, 0.125f}));
  b.refresh_compute();
  // Loads 6 4 4 0 6: mean 4. Experts 0 and 4 above it (-u), 1 and 2 at it (0), 3 below (+u).
  const float u = 0.01f;
  update_selection_bias(b, {6, 4, 4, 0, 6}, u);
  REQUIRE(same_bits(host_values(b), {0.5f - u, -0.25f, 0.0f, 1.0f + u, 0.125f - u}));
  // A mean that is no integer (3 / 5 = 0.6): nobody sits at it.
  update_selection_bias(b, {0, 1, 2, 0, 0}, u);
  REQUIRE(same_bits(host_values(b),
                    {0.5f - u + u, -0.25f - u, 0.0f - u, 1.0f + u + u, 0.125f - u + u}));
  // All equal: no change.
  const std::vector<float> before = host_values(b);
  update_selection_bias(b, {3, 3, 3, 3, 3}, u);
  REQUIRE(same_bits(host_values(b), before));
  REQUIRE_THROWS_AS(update_selection_bias(b, {1, 2, 3}, u), Error);
}

TEST_CASE("balance: AdamW keeps no state for the selection bias and leaves it bitwise unchanged",
          "[balance_bias]") {
  ParamSet ps(2);
  Router router(ps, "blocks.0.moe.router", biased_router(4));
  for (Param* p : ps.all()) {
    test::randomize_param(*p, hash_name(p->name), 0.5f);
    // A gradient on both (none ever reaches the bias; the optimizer must ignore one anyway).
    p->grad.copy_from(test::random_tensor(p->shape, hash_name(p->name) + 1));
  }
  Param& b = *router.selection_bias();
  const std::vector<float> bias_before = host_values(b),
                           weight_before = host_values(router.weight());
  optim::AdamWConfig config;
  config.weight_decay = 0.1f;
  optim::AdamW adam(ps, config);
  adam.step(1e-2f);
  adam.step(1e-2f);
  REQUIRE(same_bits(host_values(b), bias_before));
  REQUIRE_FALSE(same_bits(host_values(router.weight()), weight_before));  // the step did run
  REQUIRE_THROWS_AS(adam.state_of(b), Error);
  for (const optim::OptimizerTensor& t : adam.state())
    REQUIRE(t.name.find("router.bias") == std::string::npos);
}

TEST_CASE("balance: each step moves the biases by its loads, and a checkpoint carries them",
          "[balance_bias][train]") {
  test::ScratchDir dir("balance_bias_resume");
  const ModelConfig m = balanced_model();
  const std::vector<int64_t> blocks = m.moe_blocks();
  REQUIRE(!blocks.empty());
  train::Trainer run(m, test::short_run(6), {});
  bool moved = false;
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> before;
    for (int64_t b : blocks) before.push_back(host_values(run.params().at(bias_name(b))));
    const train::StepStats s = run.step();
    REQUIRE(s.forward.moe.size() == blocks.size());
    for (size_t l = 0; l < blocks.size(); ++l) {
      INFO("step " << step + 1 << ", block " << blocks[l]);
      const std::vector<int64_t>& load = s.forward.moe[l].load;
      int64_t total = 0;
      for (int64_t x : load) total += x;
      std::vector<float> expected = before[l];
      for (size_t e = 0; e < load.size(); ++e) {
        const int64_t diff = total - static_cast<int64_t>(load.size()) * load[e];
        expected[e] += diff > 0 ? 0.01f : diff < 0 ? -0.01f : 0.0f;
      }
      const std::vector<float> now = host_values(run.params().at(bias_name(blocks[l])));
      REQUIRE(same_bits(now, expected));
      moved = moved || !same_bits(now, before[l]);
    }
  }
  REQUIRE(moved);
  run.save(dir.path());
  const io::Checkpoint loaded = io::load_checkpoint(dir / "last.h5");
  train::Trainer resumed(model_config_from_json(loaded.model_config),
                         train::train_config_from_json(loaded.train_config), {});
  resumed.restore(loaded);
  for (int64_t b : blocks)
    REQUIRE(same_bits(host_values(resumed.params().at(bias_name(b))),
                      host_values(run.params().at(bias_name(b)))));
  for (int i = 0; i < 3; ++i) {
    run.step();
    resumed.step();
  }
  REQUIRE(test::first_difference(run.snapshot().params, resumed.snapshot().params).empty());
  REQUIRE(test::first_difference(run.snapshot().optim, resumed.snapshot().optim).empty());
}

// A 16-bit model keeps its selection biases in f32: an update far below bf16's spacing (2^-7 near
// 1) still moves them, a checkpoint keeps f32, and a file that holds them in the model's dtype
// (moe-convert dtype, or one written before they were f32) loads, converted.
TEST_CASE("balance: a bf16 model keeps its selection biases in f32", "[balance_bias][train]") {
  test::ScratchDir dir("balance_bias_bf16");
  ParamSet ps(3, DType::bf16);
  Router router(ps, "blocks.0.moe.router", biased_router(4));
  Param& b = *router.selection_bias();
  REQUIRE(b.value.dtype() == DType::f32);
  REQUIRE(router.weight().value.dtype() == DType::bf16);
  b.value.copy_from(Tensor::from_vector({4}, std::vector<float>{1.0f, 1.0f, -1.0f, 0.0f}));
  b.refresh_compute();
  update_selection_bias(b, {0, 4, 2, 2}, 1e-3);  // mean 2: +u, -u, 0, 0
  REQUIRE(same_bits(host_values(b), {1.0f + 1e-3f, 1.0f - 1e-3f, -1.0f, 0.0f}));

  ModelConfig m = balanced_model();
  m.dtype = DType::bf16;
  m.resolve();
  const std::string name = bias_name(m.moe_blocks().front());
  train::Trainer run(m, test::short_run(4), {});
  REQUIRE(run.params().at(name).value.dtype() == DType::f32);
  for (int i = 0; i < 2; ++i) run.step();
  run.save(dir.path());
  io::Checkpoint saved = io::load_checkpoint(dir / "last.h5");
  const auto stored = std::find_if(saved.params.begin(), saved.params.end(),
                                   [&](const io::NamedTensor& nt) { return nt.name == name; });
  REQUIRE(stored != saved.params.end());
  REQUIRE(stored->dtype() == DType::f32);
  // The same checkpoint with every selection bias rounded to bf16: it resumes, the bias converted.
  for (io::NamedTensor& nt : saved.params)
    if (nt.name.ends_with(".moe.router.bias")) nt.tensor = nt.tensor.to(DType::bf16);
  train::Trainer resumed(model_config_from_json(saved.model_config),
                         train::train_config_from_json(saved.train_config), {});
  resumed.restore(saved);
  const Param& loaded = resumed.params().at(name);
  REQUIRE(loaded.value.dtype() == DType::f32);
  REQUIRE(same_bits(host_values(loaded), stored->tensor.to(DType::f32).to_vector()));
  resumed.step();  // trains on
}
