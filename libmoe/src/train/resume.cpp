#include "moe/train/resume.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "moe/error.h"
#include "moe/io/dataset.h"

namespace moe::train {

namespace {

// The config key of a flag: "--d-model" -> "d_model" ("--vocab" sets vocab_size).
std::string flag_key(const std::string& flag) {
  std::string key = flag.substr(2);
  for (char& c : key)
    if (c == '-') c = '_';
  return key == "vocab" ? "vocab_size" : key;
}

TrainConfig resumed_train(const io::Checkpoint& resume, const TrainConfig& given,
                          const GivenFlags& flags) {
  TrainConfig tc = train_config_from_json(resume.train_config);
  nlohmann::json now = to_json(given), merged = to_json(tc);
  for (const std::string& flag : flags.train) {
    std::string key = flag_key(flag);
    if (now.contains(key)) merged[key] = now[key];
  }
  if (flags.seed && given.seed != tc.seed)
    throw UsageError(str("--seed ", given.seed, " contradicts the checkpoint's seed ", tc.seed));
  return train_config_from_json(merged, tc);
}

ModelConfig resumed_model(const io::Checkpoint& resume, ModelConfig m, const GivenFlags& flags) {
  ModelConfig saved = model_config_from_json(resume.model_config);
  if (!flags.model.empty()) {
    m.resolve();
    nlohmann::json a = to_json(m), b = to_json(saved);
    for (const std::string& flag : flags.model) {
      std::string key = flag_key(flag);
      if (a.contains(key) && a[key] != b[key])
        throw UsageError(str(flag, " ", a[key].dump(), " contradicts the checkpoint's ",
                             b[key].dump(), " (a resumed run keeps its model)"));
    }
  }
  return saved;
}

}  // namespace

RunConfig resume_config(const io::Checkpoint* resume, ModelConfig model, TrainConfig train,
                        const GivenFlags& given) {
  RunConfig run;
  run.train = resume ? resumed_train(*resume, train, given) : train;
  if (run.train.data.empty())
    throw UsageError("--data is required (the text or token file to train on)");
  if (resume) {
    run.model = resumed_model(*resume, std::move(model), given);
  } else {
    model.resolve();
    run.model = std::move(model);
    const bool token_file =
        io::resolve_token_format(run.train.data, io::parse_token_format(run.train.data_format)) !=
        io::TokenFormat::text;
    const bool vocab_given =
        std::find(given.model.begin(), given.model.end(), "--vocab") != given.model.end();
    if (token_file && !vocab_given) run.model.vocab_size = 0;  // from the data
  }
  return run;
}

void check_resume_ranks(const io::Checkpoint& head, const std::string& path, int world_size) {
  const io::Sharding& layout = head.sharding;
  if (layout.rank < 0 || layout.world_size == world_size) return;
  throw Error(str("'", path, "' was written by ", layout.world_size, " ranks (--ep ",
                  layout.ep_size, layout.shard_embedding ? ", --shard-embedding" : "",
                  "); this run has ", world_size, world_size == 1 ? " rank" : " ranks",
                  ": resume it under mpiexec -n ", layout.world_size,
                  ", or merge it into one file with moe-convert merge ", path,
                  " -o FILE and resume from that"));
}

}  // namespace moe::train
