// train::resume_config: which settings a resumed run takes from its checkpoint and which from the
// flags given now (moe-train's rules).
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "moe/train/resume.h"
#include "support/models.h"
#include "train/setting_keys.h"

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
  given.train = {Setting::steps, Setting::data};
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
  given.model = {Setting::layers};  // given and equal: fine, d_model (not given) still ignored
  REQUIRE(train::resume_config(&ckpt, flags, saved_train(), given).model.d_model == 32);
  given.model = {Setting::d_model};
  REQUIRE_THROWS_WITH(
      train::resume_config(&ckpt, flags, saved_train(), given),
      "--d-model 64 contradicts the checkpoint's 32 (a resumed run keeps its model)");
  flags.d_model = 32;
  flags.vocab_size = 300;
  given.model = {Setting::vocab};  // the setting of vocab_size
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
  given.model = {Setting::vocab};
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
  given.train = {Setting::data,
                 Setting::batch};  // given with the checkpoint's values: nothing to say
  REQUIRE(train::resume_config(&ckpt, saved_model(), now, given).overrides.empty());
  now.steps = 400;
  now.batch = saved_train().batch * 2;
  given.train = {Setting::steps, Setting::batch};
  const std::vector<std::string> lines =
      train::resume_config(&ckpt, saved_model(), now, given).overrides;
  REQUIRE(lines.size() == 3);
  REQUIRE(lines[0] == "--steps 100 -> 400");
  REQUIRE(lines[1] ==
          "--batch " + std::to_string(saved_train().batch) + " -> " + std::to_string(now.batch));
  // Step 61 of a cosine over 100 steps vs over 400: the new rate is higher.
  REQUIRE_THAT(lines[2], Catch::StartsWith("the learning rate of step 61 goes from "));
  // Only --batch: the schedule is the same, no rate line.
  given.train = {Setting::batch};
  REQUIRE(train::resume_config(&ckpt, saved_model(), now, given).overrides.size() == 1);
}

namespace {

// A mixtral model with YaRN over twice an original context of 16 positions, resolved.
ModelConfig yarn_model() {
  ModelConfig m = test::small_model_config(Arch::mixtral);
  m.rope_type = RopeType::yarn;
  m.yarn.factor = 2;
  m.yarn.original_ctx = 16;
  m.yarn.mscale_all_dim = 1;
  m.resolve();
  return m;
}

}  // namespace

TEST_CASE("resume_config: YaRN settings given are checked against the checkpoint's yarn keys",
          "[train]") {
  const io::Checkpoint ckpt = checkpoint_of(yarn_model(), saved_train());
  // As moe-train passes `--resume CKPT --rope-scaling yarn --rope-factor 2 --mscale-all-dim 1`:
  // the settings not given (--arch gpt among them) are the flags' defaults, and ignored.
  ModelConfig flags = test::small_model_config(Arch::gpt);
  flags.rope_type = RopeType::yarn;
  flags.yarn.factor = 2;
  flags.yarn.mscale_all_dim = 1;
  train::GivenFlags given;
  given.model = {Setting::rope_scaling, Setting::rope_factor, Setting::mscale_all_dim};
  const train::RunConfig run = train::resume_config(&ckpt, flags, saved_train(), given);
  REQUIRE(run.model.arch == Arch::mixtral);  // the checkpoint's model
  REQUIRE(run.model.rope_type == RopeType::yarn);
  REQUIRE(run.model.yarn.factor == 2);
  REQUIRE(run.model.yarn.original_ctx == 16);

  // A nested key that differs is refused by its flag, with both values.
  flags.yarn.factor = 4;
  REQUIRE_THROWS_WITH(
      train::resume_config(&ckpt, flags, saved_train(), given),
      "--rope-factor 4.0 contradicts the checkpoint's 2.0 (a resumed run keeps its model)");
  // A YaRN setting alone (no --rope-scaling) is compared by its own value.
  flags.rope_type = RopeType::none;
  flags.yarn.factor = 2;
  flags.yarn.original_ctx = 8;
  given.model = {Setting::rope_factor};
  REQUIRE(train::resume_config(&ckpt, flags, saved_train(), given).model.yarn.factor == 2);
  given.model = {Setting::original_max_positions};
  REQUIRE_THROWS_WITH(train::resume_config(&ckpt, flags, saved_train(), given),
                      "--original-max-position-embeddings 8.0 contradicts the checkpoint's 16.0 "
                      "(a resumed run keeps its model)");
  given.model = {Setting::rope_scaling};  // --rope-scaling none
  REQUIRE_THROWS_WITH(
      train::resume_config(&ckpt, flags, saved_train(), given),
      "--rope-scaling off contradicts the checkpoint's \"yarn\" (a resumed run keeps its model)");

  // A checkpoint without RoPE scaling has no yarn keys: any YaRN value given contradicts it.
  const io::Checkpoint plain = checkpoint_of(saved_model(), saved_train());
  given.model = {Setting::rope_factor};
  REQUIRE_THROWS_WITH(
      train::resume_config(&plain, flags, saved_train(), given),
      "--rope-factor 2.0 contradicts the checkpoint's off (a resumed run keeps its model)");
  given.model = {Setting::rope_scaling};  // --rope-scaling none agrees with it
  REQUIRE(train::resume_config(&plain, flags, saved_train(), given).model.rope_type ==
          RopeType::none);

  // --init: the same keys, in its words.
  flags.yarn.factor = 4;
  given.model = {Setting::rope_factor};
  REQUIRE_THROWS_WITH(train::init_config(ckpt, flags, saved_train(), given),
                      "--rope-factor 4.0 contradicts the checkpoint's 2.0 (--init keeps the model "
                      "whose weights it starts from)");
  flags.yarn.factor = 2;
  REQUIRE(train::init_config(ckpt, flags, saved_train(), given).model.yarn.factor == 2);
}

TEST_CASE("resume_config: --init sets the settings that shape training anew", "[train]") {
  const io::Checkpoint ckpt = checkpoint_of(saved_model(), saved_train());
  ModelConfig flags = test::small_model_config(Arch::gpt);
  flags.aux_loss_coef = 0.5;
  flags.d_model = 64;  // not given: the checkpoint's
  train::GivenFlags given;
  given.model = {Setting::aux_loss_coef};
  const train::RunConfig run = train::init_config(ckpt, flags, saved_train(), given);
  REQUIRE(run.model.aux_loss_coef == 0.5);
  REQUIRE(run.model.d_model == 32);
  // A resumed run keeps even those.
  REQUIRE_THROWS_WITH(train::resume_config(&ckpt, flags, saved_train(), given),
                      "--aux-loss-coef 0.5 contradicts the checkpoint's " +
                          nlohmann::json(saved_model().aux_loss_coef).dump() +
                          " (a resumed run keeps its model)");
}

TEST_CASE("setting keys: each setting's key is one the configs write", "[train][settings]") {
  using train::config_key;
  using train::SettingConfig;
  // The keys of a model that writes every key, the ones written only when set included (the
  // clamped SwiGLU's are gpt_oss's: written as that family's file; to_json does not validate).
  ModelConfig m = yarn_model();
  m.sliding_window = 8;
  m.tie_embeddings = true;
  nlohmann::json model = to_json(m);
  m.arch = Arch::gpt_oss;
  model.update(to_json(m));
  const nlohmann::json trained = train::to_json(train::TrainConfig{});
  int model_keys = 0;
#define MOE_CHECK_KEYS(name, flag)                                         \
  if (const char* key = config_key(Setting::name, SettingConfig::model)) { \
    INFO("Setting::" #name " -> model key " << key);                       \
    CHECK(model.contains(nlohmann::json::json_pointer(key)));              \
    ++model_keys;                                                          \
  }                                                                        \
  if (const char* key = config_key(Setting::name, SettingConfig::train)) { \
    INFO("Setting::" #name " -> training key " << key);                    \
    CHECK(trained.contains(nlohmann::json::json_pointer(key)));            \
  }
  MOE_SETTINGS(MOE_CHECK_KEYS)
#undef MOE_CHECK_KEYS
  // Every setting of the model's groups (moe-train's model flags) sets a model key.
#define MOE_CHECK_MODEL_KEY(name, flag)                                \
  {                                                                    \
    INFO("Setting::" #name);                                           \
    CHECK(config_key(Setting::name, SettingConfig::model) != nullptr); \
  }
  MOE_MODEL_SETTINGS(MOE_CHECK_MODEL_KEY)
  MOE_ATTN_SETTINGS(MOE_CHECK_MODEL_KEY)
#undef MOE_CHECK_MODEL_KEY
  CHECK(model_keys > 0);
  // The keys spelt otherwise than their flags, and nested ones.
  CHECK(std::string(config_key(Setting::vocab, SettingConfig::model)) == "/vocab_size");
  CHECK(std::string(config_key(Setting::router, SettingConfig::model)) == "/router_scoring");
  CHECK(std::string(config_key(Setting::rope_scaling, SettingConfig::model)) == "/rope_type");
  CHECK(std::string(config_key(Setting::original_max_positions, SettingConfig::model)) ==
        "/yarn/original_ctx");
  CHECK(config_key(Setting::lr, SettingConfig::model) == nullptr);
  CHECK(config_key(Setting::d_model, SettingConfig::train) == nullptr);
}
