// Activation recomputation (--recompute moe|block): bitwise the same training as keeping every
// activation, with a lower activation high-water mark (block < moe < none).
#include <catch2/catch.hpp>
#include <cstring>

#include "moe/io/checkpoint.h"
#include "moe/train/trainer.h"
#include "support/models.h"
#include "support/run.h"
#include "support/state.h"

using namespace moe;

namespace {

// Drops, jitter, aux and z losses on: recomputation must reproduce all of them.
ModelConfig routed_model(Arch arch, DType dtype = DType::f32) {
  ModelConfig c = test::small_model_config(arch);
  c.capacity_factor = 1.0;
  c.router_jitter = 0.01;
  c.dtype = dtype;
  c.resolve();
  return c;
}

train::TrainConfig small_train(const std::string& recompute, int64_t grad_accum = 1) {
  train::TrainConfig t;
  t.data = test::fortunes_path("computers");
  t.batch = 8;
  t.steps = 3;
  t.lr = 3e-3;
  t.warmup = 1;
  t.eval_batches = 2;
  t.seed = 5;
  t.recompute = nn::parse_recompute(recompute);
  t.grad_accum = grad_accum;
  return t;
}

bool same_bits(const std::vector<io::NamedTensor>& x, const std::vector<io::NamedTensor>& y) {
  return test::first_difference(x, y).empty();
}

}  // namespace

TEST_CASE("recompute: moe and block train bitwise like none (gpt, mixtral, f32, bf16)",
          "[train][recompute]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (Arch arch : {Arch::gpt, Arch::mixtral}) {
      for (int64_t grad_accum : {1, 2}) {
        DYNAMIC_SECTION(arch_name(arch)
                        << " " << dtype_name(dtype) << " --grad-accum " << grad_accum) {
          train::Trainer none(routed_model(arch, dtype), small_train("none", grad_accum), {});
          std::vector<train::StepStats> kept;
          for (int i = 0; i < 3; ++i) kept.push_back(none.step(true));
          for (const char* mode : {"moe", "block"}) {
            INFO("--recompute " << mode);
            train::Trainer again(routed_model(arch, dtype), small_train(mode, grad_accum), {});
            for (int i = 0; i < 3; ++i) {
              const train::StepStats s = again.step(true);
              REQUIRE(s.forward.total == kept[static_cast<size_t>(i)].forward.total);
              REQUIRE(s.grad_norm == kept[static_cast<size_t>(i)].grad_norm);
              REQUIRE(s.forward.moe[0].choices ==
                      kept[static_cast<size_t>(i)].forward.moe[0].choices);
            }
            REQUIRE(same_bits(none.snapshot().params, again.snapshot().params));
            REQUIRE(same_bits(none.snapshot().optim, again.snapshot().optim));
          }
        }
      }
    }
  }
}

TEST_CASE(
    "recompute: a shared expert, sigmoid routing and the bias update train bitwise "
    "like none",
    "[train][recompute]") {
  ModelConfig c = routed_model(Arch::mixtral);
  c.shared_expert_ff = 24;
  c.router_scoring = nn::RouterScoring::sigmoid;
  c.balance_bias_rate = 0.01;
  c.resolve();
  train::Trainer none(c, small_train("none", 2), {});
  for (int i = 0; i < 3; ++i) none.step();
  for (const char* mode : {"moe", "block"}) {
    INFO("--recompute " << mode);
    train::Trainer again(c, small_train(mode, 2), {});
    for (int i = 0; i < 3; ++i) again.step();
    REQUIRE(same_bits(none.snapshot().params, again.snapshot().params));
    REQUIRE(same_bits(none.snapshot().optim, again.snapshot().optim));
  }
}

TEST_CASE("recompute: the activation high-water mark falls from none to moe to block",
          "[train][recompute]") {
  // Long sequences and wide experts, so that attention's [B,H,T,T] probabilities and the experts'
  // [M,F] hidden activations dominate.
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.layers = 4;
  c.seq = 256;
  c.d_ff = 256;
  c.capacity_factor = 0;  // dropless: M = N k rows through the experts in every layer
  c.resolve();
  auto peak = [&](const char* mode) {
    train::TrainConfig t = small_train(mode);
    t.batch = 4;
    train::Trainer trainer(c, t, {});
    return trainer.step().activation_peak_bytes;
  };
  const int64_t none = peak("none"), moe = peak("moe"), block = peak("block");
  INFO("peak activation bytes: none " << none << ", moe " << moe << ", block " << block);
  REQUIRE(block < moe);
  REQUIRE(moe < none);
  // What each mode drops. N = 4 x 256 tokens, k = 2 (dropless: M = 2048 rows), F = 256, D = 32,
  // H = 4 heads, float32; one [M,F] tensor is 2 MiB. The arena frees nothing until the step
  // ends, so backward's temporaries add up too. none holds, for each of the 4 MoE layers, the
  // experts' h, h3, a from forward and dh, dh3 from backward: 20 [M,F]. moe holds none of them
  // but one layer's recomputation at a time in its scratch (h, h3, a, dh, dh3 and a few [M,D]):
  // at least 15 [M,F] fewer, less the few [M,D] (256 KiB each) per layer, so 14 [M,F].
  const int64_t rows = 4 * 256 * 2, hidden = rows * 256 * 4;
  REQUIRE(none - moe >= 14 * hidden);
  // block keeps each block's input ([N,D], 128 KiB) and recomputes one block at a time: at
  // least 3 of the 4 blocks' attention probabilities [B,H,T,T] (4 MiB each) fewer than moe.
  const int64_t probs = int64_t(4) * 4 * 256 * 256 * 4;
  REQUIRE(moe - block >= 3 * probs);
}
