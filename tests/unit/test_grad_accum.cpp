// Gradient accumulation (--grad-accum): N micro-batches of a step give the gradient of the step's
// mean loss (to float32 summation order where the math allows it), the same data, bitwise
// reproducible runs and resumes, and clear errors for a batch that does not split.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "moe/io/checkpoint.h"
#include "moe/models/transformer.h"
#include "moe/train/trainer.h"
#include "support/gradcheck.h"
#include "support/models.h"
#include "support/run.h"
#include "support/state.h"
#include "support/training.h"

using namespace moe;

namespace {

// Where the math allows equality with one big batch: no capacity drops (dropless), no aux or
// z-loss (their f_e, P_e and means are per micro-batch), no router jitter.
ModelConfig exact_model(Arch arch) {
  ModelConfig c = test::small_model_config(arch);
  c.vocab_size = 256;
  c.capacity_factor = 0;
  c.aux_loss_coef = 0;
  c.z_loss_coef = 0;
  c.router_jitter = 0;
  c.resolve();
  return c;
}

// The default routing settings of a real run: drops, aux and z losses, jitter.
ModelConfig routed_model(Arch arch) { return test::routed_model(arch); }

train::TrainConfig small_train(int64_t steps, int64_t grad_accum) {
  train::TrainConfig t = test::short_run(steps);
  t.grad_accum = grad_accum;
  return t;
}

// Every gradient after forward_backward over ids/targets [B,T] as one batch, or as `micro` passes
// of B/micro rows each scaled by `scale`.
std::vector<Tensor> gradients(const ModelConfig& config, const Tensor& ids, const Tensor& targets,
                              int64_t micro, float scale) {
  ParamSet ps(11);
  Transformer model(config, ps);
  ps.zero_grad();
  const int64_t rows = ids.dim(0) / micro;
  for (int64_t m = 0; m < micro; ++m) {
    nn::RouterStep step;
    step.first_token = m * rows * ids.dim(1);
    TrainPass pass;
    pass.loss_scale = scale;
    model.forward_backward(ids.rows(m * rows, (m + 1) * rows),
                           targets.rows(m * rows, (m + 1) * rows), step, pass);
  }
  std::vector<Tensor> grads;
  for (const Param* p : std::as_const(ps).all()) {
    // The key bias shifts every score of a query's row equally: softmax cancels it, its
    // gradient is zero but for rounding noise, which has no scale to compare against.
    if (p->name.ends_with("attn.k.bias")) continue;
    grads.push_back(p->grad.clone());
  }
  return grads;
}

// The largest |a - b| over a tensor, relative to its largest |b|.
double max_relative_difference(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(double(x[i]) - double(y[i])));
    scale = std::max(scale, std::abs(double(y[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

bool same_bits(const std::vector<io::NamedTensor>& x, const std::vector<io::NamedTensor>& y) {
  return test::first_difference(x, y).empty();
}

}  // namespace

// Tolerance: a weight gradient sums one term per token, n = 8 x 32 = 256 terms; the micro-batches
// cut that sum into N partial sums (and the expert GEMMs into other segments), a different
// float32 order. Reordering a sum of n terms moves it by at most (n-1) u sum|terms| with
// u = 2^-24 = 6e-8, i.e. 1.5e-5 x sum|terms|; the terms of these gradients have mixed signs and
// sum|terms| stays within a few times max|g| here, so 1e-4 x max|g| per tensor (measured: below
// 1e-6 on AMD EPYC). The wrong scale (no 1/N) is off by a factor N - 1 of max|g|: the tolerance
// tells the two apart by 4 orders.
TEST_CASE("grad-accum: N micro-batches scaled 1/N give one batch's gradient (float32 order)",
          "[train][grad_accum]") {
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    const ModelConfig config = exact_model(arch);
    const Tensor ids = test::random_ids({8, config.seq}, 3, 256);
    const Tensor targets = test::random_ids({8, config.seq}, 4, 256);
    const std::vector<Tensor> whole = gradients(config, ids, targets, 1, 1.0f);
    for (int64_t micro : {2, 4, 8}) {
      DYNAMIC_SECTION(arch_name(arch) << " --grad-accum " << micro) {
        const std::vector<Tensor> parts =
            gradients(config, ids, targets, micro, 1.0f / static_cast<float>(micro));
        REQUIRE(parts.size() == whole.size());
        double worst = 0;
        for (size_t i = 0; i < whole.size(); ++i)
          worst = std::max(worst, max_relative_difference(parts[i], whole[i]));
        INFO("largest difference / max|g| of a tensor: " << worst);
        REQUIRE(worst < 1e-4);
        // Unscaled micro-batches would train on N times the gradient: the check sees it.
        const std::vector<Tensor> unscaled = gradients(config, ids, targets, micro, 1.0f);
        double wrong = 0;
        for (size_t i = 0; i < whole.size(); ++i)
          wrong = std::max(wrong, max_relative_difference(unscaled[i], whole[i]));
        REQUIRE(wrong > 0.5 * static_cast<double>(micro - 1));
      }
    }
  }
}

TEST_CASE("grad-accum: a run equals --grad-accum 1's to float32 order, steps see the same tokens",
          "[train][grad_accum]") {
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    DYNAMIC_SECTION(arch_name(arch)) {
      train::Trainer one(exact_model(arch), small_train(3, 1), {});
      train::Trainer four(exact_model(arch), small_train(3, 4), {});
      for (int i = 0; i < 3; ++i) {
        const train::StepStats a = one.step(true), b = four.step(true);
        REQUIRE(a.token_ids == b.token_ids);  // the same global batch, whatever N
        REQUIRE(a.tokens == b.tokens);
        // The step's loss is the mean of its micro-batches' means: the batch's mean.
        REQUIRE(b.forward.loss == Approx(a.forward.loss).epsilon(1e-5));
        REQUIRE(b.forward.moe.size() == a.forward.moe.size());
        for (size_t l = 0; l < a.forward.moe.size(); ++l) {
          REQUIRE(b.forward.moe[l].assignments == a.forward.moe[l].assignments);
          REQUIRE(b.forward.moe[l].choices.size() == a.forward.moe[l].choices.size());
        }
      }
      REQUIRE(one.tokens_seen() == four.tokens_seen());
      // AdamW moves each weight by about lr x g / (|g| + eps) per step: gradients that agree to
      // float32 order (about 1e-6 of the largest, measured above) give updates that agree far
      // within lr = 3e-3 (measured: at most 1e-5 after 3 steps), except where a gradient is
      // itself as small as that rounding (its sign is noise; the update then differs by up to
      // 2 lr per step). So: every weight within 2 lr x 3 steps, and all but a rare few within 1e-4.
      // A different data order or a missing micro-batch moves most weights by about lr.
      const io::Checkpoint a = one.snapshot(), b = four.snapshot();
      int64_t elements = 0, outliers = 0;
      double worst = 0;
      for (size_t i = 0; i < a.params.size(); ++i) {
        const std::vector<float> x = a.params[i].tensor.to_vector(),
                                 y = b.params[i].tensor.to_vector();
        for (size_t j = 0; j < x.size(); ++j) {
          const double d = std::abs(double(x[j]) - double(y[j]));
          worst = std::max(worst, d);
          outliers += d > 1e-4;
        }
        elements += static_cast<int64_t>(x.size());
      }
      INFO("largest difference " << worst << ", " << outliers << " of " << elements
                                 << " weights differ by more than 1e-4");
      REQUIRE(worst <= 2 * 3e-3 * 3);
      REQUIRE(outliers <= elements / 1000);
    }
  }
}

TEST_CASE("grad-accum: runs are bitwise reproducible, and a resume equals the straight run",
          "[train][grad_accum]") {
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    DYNAMIC_SECTION(arch_name(arch)) {
      test::ScratchDir dir("grad_accum_resume");
      train::Trainer straight(routed_model(arch), small_train(6, 4), {});
      for (int i = 0; i < 6; ++i) straight.step();
      train::Trainer again(routed_model(arch), small_train(6, 4), {});
      for (int i = 0; i < 6; ++i) again.step();
      REQUIRE(same_bits(straight.snapshot().params, again.snapshot().params));
      REQUIRE(same_bits(straight.snapshot().optim, again.snapshot().optim));

      train::Trainer first(routed_model(arch), small_train(6, 4), {});
      for (int i = 0; i < 3; ++i) first.step();
      first.save(dir.path());
      const io::Checkpoint loaded = io::load_checkpoint(dir / "last.h5");
      const train::TrainConfig resumed_config = train::train_config_from_json(loaded.train_config);
      REQUIRE(resumed_config.grad_accum == 4);  // saved in the checkpoint's training config
      train::Trainer resumed(model_config_from_json(loaded.model_config), resumed_config, {});
      resumed.restore(loaded);
      for (int i = 0; i < 3; ++i) resumed.step();
      REQUIRE(same_bits(straight.snapshot().params, resumed.snapshot().params));
      REQUIRE(same_bits(straight.snapshot().optim, resumed.snapshot().optim));
      // With routing statistics per micro-batch (aux loss, capacity), N = 4 is another run.
      train::Trainer one(routed_model(arch), small_train(6, 1), {});
      for (int i = 0; i < 6; ++i) one.step();
      REQUIRE_FALSE(same_bits(straight.snapshot().params, one.snapshot().params));
    }
  }
}

TEST_CASE("grad-accum: a batch that does not split, and bad values, are usage errors",
          "[train][grad_accum]") {
  train::TrainConfig t = small_train(1, 3);  // --batch 8
  REQUIRE_THROWS_AS(train::Trainer(routed_model(Arch::gpt), t, {}), UsageError);
  REQUIRE_THROWS_WITH(train::Trainer(routed_model(Arch::gpt), t, {}),
                      Catch::Contains("--batch 8") && Catch::Contains("--grad-accum 3") &&
                          Catch::Contains("multiple of 3"));
  t.grad_accum = 0;
  REQUIRE_THROWS_WITH(train::Trainer(routed_model(Arch::gpt), t, {}),
                      Catch::Contains("--grad-accum must be >= 1"));
  t.grad_accum = 8;  // one sequence per micro-batch is fine
  train::Trainer ok(routed_model(Arch::gpt), t, {});
  REQUIRE(ok.step().tokens == 8 * 32);
  t.grad_accum = 1;
  // An unknown mode is refused where its name is read (moe-train's flags, a checkpoint's config).
  REQUIRE_THROWS_WITH(nn::parse_recompute("layers"),
                      Catch::Contains("--recompute layers") && Catch::Contains("block"));
}
