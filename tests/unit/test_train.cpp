// The training loop on a real corpus: learning, exact resume, bitwise checkpoints, determinism.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "moe/io/checkpoint.h"
#include "moe/threads.h"
#include "moe/train/trainer.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;

namespace {

ModelConfig small_model(Arch arch = Arch::gpt, DType dtype = DType::f32) {
  ModelConfig c = test::small_model_config(arch);
  c.capacity_factor = 1.0;  // exercise drops too
  c.router_jitter = 0.01;
  c.dtype = dtype;
  c.resolve();
  return c;
}

train::TrainConfig small_train(int64_t steps) {
  train::TrainConfig t;
  t.data = test::fortunes_path("computers");
  t.batch = 8;
  t.steps = steps;
  t.lr = 3e-3;
  t.warmup = 4;
  t.eval_batches = 4;
  t.seed = 99;
  return t;
}

void require_same_state(train::Trainer& a, train::Trainer& b) {
  REQUIRE(a.steps_done() == b.steps_done());
  io::Checkpoint ca = a.snapshot(), cb = b.snapshot();
  REQUIRE(ca.state.data_cursor == cb.state.data_cursor);
  REQUIRE(ca.state.tokens_seen == cb.state.tokens_seen);
  REQUIRE(ca.params.size() == cb.params.size());
  REQUIRE(ca.optim.size() == cb.optim.size());
  auto same = [](const std::vector<io::NamedTensor>& x, const std::vector<io::NamedTensor>& y) {
    for (size_t i = 0; i < x.size(); ++i) {
      INFO(x[i].name);
      REQUIRE(x[i].name == y[i].name);
      REQUIRE(x[i].tensor.nbytes() == y[i].tensor.nbytes());
      REQUIRE(std::memcmp(x[i].tensor.raw(), y[i].tensor.raw(), x[i].tensor.nbytes()) == 0);
    }
  };
  same(ca.params, cb.params);
  same(ca.optim, cb.optim);
}

}  // namespace

TEST_CASE("train: a short run on a real corpus lowers validation loss clearly", "[train]") {
  train::Trainer t(small_model(), small_train(400), {});
  double before = t.evaluate();
  REQUIRE(before == Approx(std::log(256.0)).epsilon(0.05));  // uniform over bytes at init
  for (int i = 0; i < 400; ++i) t.step();
  double after = t.evaluate();
  INFO("val loss " << before << " -> " << after);
  REQUIRE(after < before - 2.5);  // from 5.5 nats (uniform over bytes) to below 3.05
}

TEST_CASE("train: 2N steps straight equal N steps, checkpoint, resume, N steps (bitwise)",
          "[train]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (Arch arch : {Arch::gpt, Arch::mixtral}) {
      DYNAMIC_SECTION(arch_name(arch) << " " << dtype_name(dtype)) {
        test::ScratchDir dir("resume");
        train::Trainer straight(small_model(arch, dtype), small_train(8), {});
        for (int i = 0; i < 8; ++i) straight.step();

        train::Trainer first(small_model(arch, dtype), small_train(8), {});
        for (int i = 0; i < 4; ++i) first.step();
        std::string path = first.save(dir.path());
        REQUIRE(path == dir / "step-00000004.h5");

        io::Checkpoint loaded = io::load_checkpoint(dir / "last.h5");
        train::Trainer resumed(model_config_from_json(loaded.model_config),
                               train::train_config_from_json(loaded.train_config), {});
        resumed.restore(loaded);
        REQUIRE(resumed.steps_done() == 4);
        for (int i = 0; i < 4; ++i) resumed.step();
        require_same_state(straight, resumed);
      }
    }
  }
}

TEST_CASE("train: checkpoint save then load is bitwise and keeps the state", "[train]") {
  test::ScratchDir dir("ckpt");
  train::Trainer t(small_model(Arch::mixtral, DType::bf16), small_train(3), {});
  for (int i = 0; i < 3; ++i) t.step();
  t.save(dir.path());
  io::Checkpoint saved = t.snapshot();
  io::Checkpoint loaded = io::load_checkpoint(dir / "step-00000003.h5");
  REQUIRE(loaded.state.step == 3);
  REQUIRE(loaded.state.tokens_seen == 3 * 8 * 32);
  REQUIRE(loaded.model_config == saved.model_config);
  REQUIRE(loaded.params.size() == saved.params.size());
  for (size_t i = 0; i < saved.params.size(); ++i) {
    REQUIRE(loaded.params[i].tensor.dtype() == DType::bf16);
    REQUIRE(std::memcmp(loaded.params[i].tensor.raw(), saved.params[i].tensor.raw(),
                        saved.params[i].tensor.nbytes()) == 0);
  }
}

TEST_CASE("train: a run is bitwise reproducible, and does not depend on the thread count",
          "[train]") {
  auto run = [](int threads) {
    set_num_threads(threads);
    train::Trainer t(small_model(Arch::mixtral), small_train(3), {});
    for (int i = 0; i < 3; ++i) t.step();
    return t.snapshot();
  };
  io::Checkpoint a = run(2), b = run(2), c = run(1);
  set_num_threads(2);
  for (size_t i = 0; i < a.params.size(); ++i) {
    INFO(a.params[i].name);
    size_t n = a.params[i].tensor.nbytes();
    REQUIRE(std::memcmp(a.params[i].tensor.raw(), b.params[i].tensor.raw(), n) == 0);
    REQUIRE(std::memcmp(a.params[i].tensor.raw(), c.params[i].tensor.raw(), n) == 0);
  }
}

TEST_CASE("train: token ids beyond the vocabulary are a usage error naming the file", "[train]") {
  test::ScratchDir dir("vocab");
  std::string tokens;
  for (int i = 0; i < 400; ++i) {
    uint16_t id = static_cast<uint16_t>(i % 300);
    tokens.append(reinterpret_cast<const char*>(&id), 2);
  }
  test::write_file(dir / "ids.u16", tokens);
  train::TrainConfig t = small_train(1);
  t.data = dir / "ids.u16";
  REQUIRE_THROWS_WITH(train::Trainer(small_model(), t, {}),
                      Catch::Contains("ids.u16") && Catch::Contains("299"));
  ModelConfig m = small_model();
  m.vocab_size = 0;  // sized from the data
  train::Trainer ok(m, t, {});
  REQUIRE(ok.model_config().vocab_size == 300);
}
