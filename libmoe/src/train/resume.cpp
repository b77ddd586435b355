#include "moe/train/resume.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "moe/error.h"
#include "moe/io/convert.h"
#include "moe/io/dataset.h"
#include "moe/optim/adamw.h"
#include "moe/settings.h"
#include "train/setting_keys.h"

namespace moe::train {

namespace {

using nlohmann::json;

// Model settings that change how a model trains, not its parameters: a run started from a
// checkpoint's weights (--init) may set them anew.
constexpr Setting kTrainingModelSettings[] = {
    Setting::aux_loss_coef,   Setting::z_loss_coef,       Setting::router_jitter,
    Setting::capacity_factor, Setting::balance_bias_rate, Setting::router_center_rate};

// The key a given setting sets in `config`'s JSON (a caller that listed a setting under the
// wrong config is told which).
json::json_pointer key_of(Setting setting, SettingConfig config) {
  const char* key = config_key(setting, config);
  if (key == nullptr)
    throw Error(str(flag_for(setting), " sets no key of the ",
                    config == SettingConfig::model ? "model" : "training", " config"));
  return json::json_pointer(key);
}

// The value at `key`; null where the config does not write it (keys written only when set).
json value_at(const json& config, const json::json_pointer& key) {
  return config.contains(key) ? config.at(key) : json();
}

// A model setting as a message shows it; keys written only when set (sliding_window,
// tie_embeddings, the yarn object) are absent when off.
std::string shown(const json& value) { return value.is_null() ? std::string("off") : value.dump(); }

TrainConfig resumed_train(const io::Checkpoint& resume, const TrainConfig& given,
                          const GivenFlags& flags) {
  TrainConfig tc = train_config_from_json(resume.train_config);
  const json now = to_json(given);
  json merged = to_json(tc);
  for (Setting setting : flags.train) {
    const json::json_pointer key = key_of(setting, SettingConfig::train);
    if (now.contains(key)) merged[key] = now.at(key);
  }
  if (flags.seed && given.seed != tc.seed)
    throw UsageError(str(flag_for(Setting::seed), " ", given.seed,
                         " contradicts the checkpoint's seed ", tc.seed));
  return train_config_from_json(merged, tc);
}

// The model the flags describe, as the checkpoint's JSON would hold it, with its yarn object
// whatever its RoPE scaling: each YaRN setting given is compared by its own value (to_json writes
// the object only with rope_type yarn). The flags' RoPE is not checked against the flags'
// architecture: a resumed model's architecture is the checkpoint's, whose RoPE it is compared to.
json flags_model_json(ModelConfig m) {
  const RopeType rope = m.rope_type;
  m.rope_type = RopeType::none;
  m.resolve();
  json j = to_json(m);
  ModelConfig with_yarn = m;
  with_yarn.rope_type = RopeType::yarn;
  j["yarn"] = to_json(with_yarn).at("yarn");
  if (rope != RopeType::none) j["rope_type"] = rope_type_name(rope);
  return j;
}

// The checkpoint's model; each model flag given must agree with it, except (`fresh`: a run that
// starts from the checkpoint's weights) the settings that shape training, not the parameters.
ModelConfig kept_model(const io::Checkpoint& ckpt, const ModelConfig& m, const GivenFlags& flags,
                       bool fresh) {
  ModelConfig saved = model_config_from_json(ckpt.model_config);
  if (!flags.model.empty()) {
    const json a = flags_model_json(m);
    json b = to_json(saved);
    for (Setting setting : flags.model) {
      const json::json_pointer key = key_of(setting, SettingConfig::model);
      if (fresh && std::find(std::begin(kTrainingModelSettings), std::end(kTrainingModelSettings),
                             setting) != std::end(kTrainingModelSettings)) {
        b[key] = a.at(key);
        continue;
      }
      const json given = value_at(a, key), saved_value = value_at(b, key);
      if (given != saved_value)
        throw UsageError(str(flag_for(setting), " ", shown(given), " contradicts the checkpoint's ",
                             shown(saved_value),
                             fresh ? str(" (", flag_for(Setting::init),
                                         " keeps the model whose weights it starts from)")
                                   : std::string(" (a resumed run keeps its model)")));
    }
    ModelConfig now = model_config_from_json(b);
    // Turning a softmax router's bias update on or off would add or drop a parameter the
    // checkpoint has or lacks (ModelConfig::router_selection_bias).
    if (now.router_selection_bias() != saved.router_selection_bias())
      throw UsageError(
          str(flag_for(Setting::balance_bias_rate), " ", now.balance_bias_rate,
              now.router_selection_bias() ? " needs the routers' selection bias, which"
                                          : " would drop the routers' selection bias, which",
              " the checkpoint's model (softmax routing, rate ", saved.balance_bias_rate, ") ",
              now.router_selection_bias() ? "does not have" : "has"));
    // Likewise the routers' running mean (ModelConfig::router_center).
    if (now.router_center() != saved.router_center())
      throw UsageError(str(flag_for(Setting::router_center_rate), " ", now.router_center_rate,
                           now.router_center() ? " needs the routers' running mean, which"
                                               : " would drop the routers' running mean, which",
                           " the checkpoint's model (rate ", saved.router_center_rate, ") ",
                           now.router_center() ? "does not have" : "has"));
    saved = now;
  }
  return saved;
}

void absolute_paths(TrainConfig& c) {
  for (std::string* path : {&c.data, &c.val, &c.tasks})
    if (!path->empty() && *path != "-")
      *path = std::filesystem::absolute(*path).lexically_normal().string();
}

// What the flags changed, for the log (RunConfig::overrides).
std::vector<std::string> overrides_of(const io::Checkpoint& resume, const TrainConfig& now,
                                      const GivenFlags& flags) {
  TrainConfig saved = train_config_from_json(resume.train_config);
  absolute_paths(saved);  // a checkpoint of an earlier build may hold them relative
  const json before = to_json(saved), after = to_json(now);
  std::vector<std::string> lines;
  for (Setting setting : flags.train) {
    const json::json_pointer key = key_of(setting, SettingConfig::train);
    if (before.contains(key) && after.contains(key) && before.at(key) != after.at(key))
      lines.push_back(
          str(flag_for(setting), " ", before.at(key).dump(), " -> ", after.at(key).dump()));
  }
  // The schedule is a function of (step, steps, warmup, lr, min_lr): a longer --steps stretches
  // the cosine from here on, so the next step's rate can jump. Say by how much.
  auto lr_next = [&](const TrainConfig& c) {
    return optim::lr_at(resume.state.step, c.steps, c.warmup, static_cast<float>(c.lr),
                        static_cast<float>(c.lr * c.min_lr_ratio));
  };
  const float was = lr_next(saved), will = lr_next(now);
  if (was != will) {
    char text[160];
    std::snprintf(text, sizeof text,
                  "the learning rate of step %lld goes from %.3g to %.3g (the schedule follows "
                  "the new settings from here on)",
                  static_cast<long long>(resume.state.step + 1), was, will);
    lines.push_back(text);
  }
  return lines;
}

// The training settings a run starts with: some data named, paths stored absolute (the checkpoint
// resumes from any directory).
TrainConfig checked_train(TrainConfig train) {
  if (train.data.empty() && train.tasks.empty())  // --tasks names a file per task
    throw UsageError(
        str(flag_for(Setting::data), " is required (the text or token file to train on)"));
  absolute_paths(train);
  return train;
}

}  // namespace

RunConfig resume_config(const io::Checkpoint* resume, ModelConfig model, TrainConfig train,
                        const GivenFlags& given) {
  RunConfig run;
  run.train = checked_train(resume ? resumed_train(*resume, train, given) : std::move(train));

  if (resume) {
    run.model = kept_model(*resume, model, given, false);
    run.overrides = overrides_of(*resume, run.train, given);
  } else {
    model.resolve();
    run.model = std::move(model);
    const bool token_file =
        io::resolve_token_format(run.train.data, run.train.data_format) != io::TokenFormat::text;
    const bool vocab_given =
        std::find(given.model.begin(), given.model.end(), Setting::vocab) != given.model.end();
    if (token_file && !vocab_given) run.model.vocab_size = 0;  // from the data
  }
  return run;
}

RunConfig init_config(const io::Checkpoint& init, ModelConfig model, TrainConfig train,
                      const GivenFlags& given) {
  io::refuse_quantized(init.model_config, flag_for(Setting::init), "moe-train");
  RunConfig run;
  run.train = checked_train(std::move(train));  // training as given; the model is the checkpoint's
  run.model = kept_model(init, model, given, true);
  return run;
}

std::string check_data_file(TrainConfig& train, bool resumed, bool data_given) {
  if (train.data == "-") return "";     // refused by the Trainer (check_data_not_stdin)
  if (!train.tasks.empty()) return "";  // --tasks: each task names its file (TaskSet reads them)
  const bool recorded = train.data_bytes >= 0 && !train.data_crc32c.empty();
  if (resumed && !data_given && !std::filesystem::exists(train.data))
    throw Error(str("the checkpoint trains on '", train.data,
                    "', which is not there any more: pass ", flag_for(Setting::data),
                    " PATH (the same file, moved) to "
                    "resume"));
  const io::FileFingerprint now = io::fingerprint_file(train.data);
  const std::string hex = now.crc32c_hex();
  const std::string was = str(train.data_bytes, " bytes, CRC-32C ", train.data_crc32c);
  const std::string is = str(now.bytes, " bytes, CRC-32C ", hex);
  const bool same = now.bytes == train.data_bytes && train.data_crc32c == hex;
  std::string note;
  if (resumed && recorded && !same) {
    if (!data_given)
      throw Error(str("the checkpoint trained on '", train.data, "' as it was then (", was,
                      "); the file there now is another (", is,
                      "), so the token stream would not continue: restore the file, or pass ",
                      flag_for(Setting::data), " ", train.data, " to train on it as it is now"));
    note = str("resume: ", flag_for(Setting::data), " ", train.data,
               " is not the file the checkpoint trained on (", was, "; now ", is,
               "): the token stream starts over on it");
  }
  train.data_bytes = now.bytes;
  train.data_crc32c = hex;
  return note;
}

std::vector<std::string> fit_layout(TrainConfig& train, const io::Checkpoint& resume,
                                    int world_size, const GivenFlags& given) {
  auto was_given = [&](Setting setting) {
    return std::find(given.train.begin(), given.train.end(), setting) != given.train.end();
  };
  const int written = resume.sharding.world_size;
  std::vector<std::string> lines;
  if (world_size == 1) {  // one layout only: every expert here, nothing to place
    if (train.ep > 1 && !was_given(Setting::ep)) {
      lines.push_back(
          str(flag_for(Setting::ep), " ", train.ep, " -> 1 (one process holds every expert)"));
      train.ep = 1;
    }
    if (train.placement != PlacementRule::fixed && !was_given(Setting::placement)) {
      lines.push_back(str(flag_for(Setting::placement), " ", placement_rule_name(train.placement),
                          " -> static (one process places nothing)"));
      train.placement = PlacementRule::fixed;
    }
    if (train.shard_embedding && !was_given(Setting::shard_embedding)) {
      lines.push_back(
          str(flag_for(Setting::shard_embedding), " -> off (one process holds the whole table)"));
      train.shard_embedding = false;
    }
    return lines;
  }
  if (world_size % train.ep != 0 && !was_given(Setting::ep)) {
    std::string fits;
    for (int n = 1; n <= world_size; ++n)
      if (world_size % n == 0) fits += str(fits.empty() ? "" : ", ", n);
    throw UsageError(str("the checkpoint's ", flag_for(Setting::ep), " ", train.ep,
                         " (it was written by ", written, written == 1 ? " rank" : " ranks",
                         ") does not divide this run's ", world_size, " ranks: pass ",
                         flag_for(Setting::ep), " N with N one of ", fits,
                         " (the experts are re-sharded on load)"));
  }
  return lines;
}

}  // namespace moe::train
