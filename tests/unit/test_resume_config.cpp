// train::resume_config: which settings a resumed run takes from its checkpoint and which from the
// flags given now (moe-train's rules).
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "moe/train/resume.h"
#include "support/models.h"

using namespace moe;

namespace {

// A checkpoint as a run with these configs would have written it (configs only).
io::Checkpoint checkpoint_of(const ModelConfig& model, const train::TrainConfig& train) {
  io::Checkpoint c;
  c.model_config = to_json(model);
  c.train_config = train::to_json(train);
  return c;
}

train::TrainConfig saved_train() {
  train::TrainConfig t;
  t.data = "saved.txt";
  t.steps = 100;
  t.lr = 1e-3;
  t.seed = 77;
  return t;
}

ModelConfig saved_model() {
  ModelConfig m = test::small_model_config(Arch::gpt);
  m.resolve();
  return m;
}

}  // namespace

TEST_CASE("resume_config: a fresh run takes the flags and resolves the model", "[train]") {
  ModelConfig flags = test::small_model_config(Arch::mixtral);
  train::TrainConfig t;
  t.data = "corpus.txt";
  t.seed = 5;
  train::RunConfig run = train::resume_config(nullptr, flags, t, {});
  REQUIRE(run.train.data == std::filesystem::absolute("corpus.txt").string());  // stored absolute
  REQUIRE(run.train.seed == 5);
  REQUIRE(run.model.arch == Arch::mixtral);
  REQUIRE(run.model.experts_per_layer.size() == static_cast<size_t>(flags.layers));  // resolved
  REQUIRE_THROWS_WITH(train::resume_config(nullptr, flags, train::TrainConfig{}, {}),
                      "--data is required (the text or token file to train on)");
}

TEST_CASE("resume_config: the checkpoint's training config, overridden by the flags given",
          "[train]") {
  const io::Checkpoint ckpt = checkpoint_of(saved_model(), saved_train());
  train::TrainConfig now;  // defaults, but --steps 200 and --data other.txt given
  now.steps = 200;
  now.data = "other.txt";
  now.lr = 9.0;  // not given: the checkpoint's value stays
  now.seed = 77;
  train::GivenFlags given;
  given.train = {"--steps", "--data"};
  train::RunConfig run =
      train::resume_config(&ckpt, test::small_model_config(Arch::gpt), now, given);
  REQUIRE(run.train.steps == 200);
  REQUIRE(run.train.data == std::filesystem::absolute("other.txt").string());
  REQUIRE(run.train.lr == 1e-3);
  REQUIRE(run.train.seed == 77);  // --seed not given: the checkpoint's, whatever the flag holds
  now.seed = 1;
  REQUIRE(train::resume_config(&ckpt, test::small_model_config(Arch::gpt), now, given).train.seed ==
          77);
  given.seed = true;
  REQUIRE_THROWS_WITH(train::resume_config(&ckpt, test::small_model_config(Arch::gpt), now, given),
                      "--seed 1 contradicts the checkpoint's seed 77");
}

TEST_CASE("resume_config: a resumed run keeps its model, flags given must agree", "[train]") {
  const io::Checkpoint ckpt = checkpoint_of(saved_model(), saved_train());
  ModelConfig flags = test::small_model_config(Arch::gpt);
  flags.d_model = 64;  // differs, but not given: ignored
  train::RunConfig run = train::resume_config(&ckpt, flags, saved_train(), {});
  REQUIRE(run.model.d_model == 32);

  train::GivenFlags given;
  given.model = {"--layers"};  // given and equal: fine, d_model (not given) still ignored
  REQUIRE(train::resume_config(&ckpt, flags, saved_train(), given).model.d_model == 32);
  given.model = {"--d-model"};
  REQUIRE_THROWS_WITH(
      train::resume_config(&ckpt, flags, saved_train(), given),
      "--d-model 64 contradicts the checkpoint's 32 (a resumed run keeps its model)");
  flags.d_model = 32;
  flags.vocab_size = 300;
  given.model = {"--vocab"};  // the flag of vocab_size
  REQUIRE_THROWS_WITH(
      train::resume_config(&ckpt, flags, saved_train(), given),
      "--vocab 300 contradicts the checkpoint's 256 (a resumed run keeps its model)");
}

TEST_CASE("resume_config: a fresh run on a token file sizes its vocabulary from the data",
          "[train]") {
  ModelConfig flags = test::small_model_config(Arch::gpt);
  train::TrainConfig t;
  t.data = "tokens.u16";
  REQUIRE(train::resume_config(nullptr, flags, t, {}).model.vocab_size == 0);
  train::GivenFlags given;
  given.model = {"--vocab"};
  REQUIRE(train::resume_config(nullptr, flags, t, given).model.vocab_size == 256);
  t.data = "tokens.bin";  // text by extension, but the format says otherwise
  REQUIRE(train::resume_config(nullptr, flags, t, {}).model.vocab_size == 256);
  t.data_format = io::TokenFormat::u32;
  REQUIRE(train::resume_config(nullptr, flags, t, {}).model.vocab_size == 0);
  // A resumed run keeps the checkpoint's vocabulary whatever its data.
  io::Checkpoint ckpt = checkpoint_of(saved_model(), t);
  REQUIRE(train::resume_config(&ckpt, flags, t, {}).model.vocab_size == 256);
}

TEST_CASE("resume_config: overrides list what the flags changed and the rate's jump", "[train]") {
  io::Checkpoint ckpt = checkpoint_of(saved_model(), saved_train());
  ckpt.state.step = 60;
  train::TrainConfig now = saved_train();
  now.data = "saved.txt";
  train::GivenFlags given;
  given.train = {"--data", "--batch"};  // given with the checkpoint's values: nothing to say
  REQUIRE(train::resume_config(&ckpt, saved_model(), now, given).overrides.empty());
  now.steps = 400;
  now.batch = saved_train().batch * 2;
  given.train = {"--steps", "--batch"};
  const std::vector<std::string> lines =
      train::resume_config(&ckpt, saved_model(), now, given).overrides;
  REQUIRE(lines.size() == 3);
  REQUIRE(lines[0] == "--steps 100 -> 400");
  REQUIRE(lines[1] ==
          "--batch " + std::to_string(saved_train().batch) + " -> " + std::to_string(now.batch));
  // Step 61 of a cosine over 100 steps vs over 400: the new rate is higher.
  REQUIRE_THAT(lines[2], Catch::StartsWith("the learning rate of step 61 goes from "));
  // Only --batch: the schedule is the same, no rate line.
  given.train = {"--batch"};
  REQUIRE(train::resume_config(&ckpt, saved_model(), now, given).overrides.size() == 1);
}
