// train::RunLoop: which steps evaluate, checkpoint, log a line and write metrics, and how a stop
// ends the run.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <vector>

#include "moe/train/run_loop.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;

namespace {

struct Seen {
  std::vector<int64_t> steps, lines, evaluated, metrics;
};

train::Trainer small_trainer(int64_t steps) {
  ModelConfig c = test::small_model_config(Arch::gpt);
  c.resolve();
  train::TrainConfig t;
  t.data = test::fortunes_path("computers");
  t.batch = 2;
  t.steps = steps;
  t.eval_batches = 1;
  return train::Trainer(c, t, {});
}

train::RunLoop::Hooks recording(Seen& seen) {
  train::RunLoop::Hooks hooks;
  hooks.log = [&](const train::StepReport& r) {
    seen.steps.push_back(r.stats.step);
    if (r.line) seen.lines.push_back(r.stats.step);
    if (r.evaluated) {
      seen.evaluated.push_back(r.stats.step);
      REQUIRE(std::isfinite(r.val_loss));
    } else {
      REQUIRE(std::isnan(r.val_loss));
    }
  };
  hooks.metrics = [&](const train::StepReport& r, nlohmann::json& j) {
    seen.metrics.push_back(r.stats.step);
    REQUIRE(j.at("step") == r.stats.step);
    REQUIRE(j.contains("val_loss") == r.evaluated);
  };
  return hooks;
}

using Steps = std::vector<int64_t>;

}  // namespace

TEST_CASE("run loop: evaluation, checkpoints, lines and metrics on their steps", "[train]") {
  test::ScratchDir dir("run_loop");
  train::Trainer trainer = small_trainer(7);
  Seen seen;
  train::RunLoop loop(trainer, {dir.path(), 3, 4, 2}, recording(seen));
  const train::RunResult result = loop.run();
  REQUIRE_FALSE(result.stopped);
  REQUIRE(seen.steps == Steps{1, 2, 3, 4, 5, 6, 7});
  REQUIRE(seen.evaluated == Steps{3, 6, 7});       // every 3rd and the last
  REQUIRE(seen.lines == Steps{1, 2, 3, 4, 6, 7});  // the first, every 2nd, every evaluation
  REQUIRE(seen.metrics == Steps{2, 3, 4, 6, 7});   // every 2nd and every evaluation
  REQUIRE(std::isfinite(result.last_val_loss));
  REQUIRE(result.last_saved == dir / "step-00000007.h5");
  REQUIRE(std::filesystem::exists(dir / "step-00000004.h5"));  // every 4th and the last
  REQUIRE_FALSE(std::filesystem::exists(dir / "step-00000003.h5"));
}

TEST_CASE("run loop: a stop ends the run before the next step, saving nothing", "[train]") {
  test::ScratchDir dir("run_loop_stop");
  train::Trainer trainer = small_trainer(10);
  Seen seen;
  train::RunLoop::Hooks hooks = recording(seen);
  hooks.stop = [&] { return trainer.steps_done() == 3; };
  const train::RunResult result = train::RunLoop(trainer, {dir.path(), 0, 0, 1}, hooks).run();
  REQUIRE(result.stopped);
  REQUIRE(trainer.steps_done() == 3);
  REQUIRE(seen.evaluated.empty());  // eval_every 0: only at the end, which never came
  REQUIRE(result.last_saved.empty());
  REQUIRE(std::isnan(result.last_val_loss));
  REQUIRE(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("run loop: a resumed run counts its first line and ETA from where it starts", "[train]") {
  test::ScratchDir dir("run_loop_resume");
  train::Trainer trainer = small_trainer(6);
  for (int i = 0; i < 4; ++i) trainer.step();
  Seen seen;
  train::RunLoop::Hooks hooks = recording(seen);
  hooks.metrics = nullptr;
  std::vector<double> eta;
  auto log = hooks.log;
  hooks.log = [&](const train::StepReport& r) {
    REQUIRE(r.first_step == 4);
    eta.push_back(r.eta_seconds);
    log(r);
  };
  train::RunLoop(trainer, {dir.path(), 0, 0, 10}, hooks).run();
  REQUIRE(seen.steps == Steps{5, 6});
  REQUIRE(seen.lines == Steps{5, 6});  // the loop's first step, then the last (evaluated)
  REQUIRE(eta.back() == 0);
  REQUIRE(eta.front() > 0);
}
