// The configuration of a training run: from the command line, or, when the run resumes, from the
// checkpoint it resumes reconciled with the flags given now. moe-train's rules, as a library call
// so that every program starting or resuming a run applies the same ones.
#pragma once
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"
#include "moe/models/config.h"
#include "moe/settings.h"
#include "moe/train/trainer.h"

namespace moe::train {

struct RunConfig {
  ModelConfig model;
  TrainConfig train;
  // A resumed run: each training flag that changed the checkpoint's setting, as the user should
  // read it before step 1 ("--lr 0.003 -> 0.0001"), and, when the learning-rate schedule changed,
  // the rate the next step gets under the old and the new settings.
  std::vector<std::string> overrides;
};

// The settings given explicitly on the command line (Setting::d_model, Setting::lr): one left at
// its default says nothing, one given says what the user wants. The library finds each by its
// config key (train/setting_keys.h: "/d_model", "/yarn/factor") and names it by its flag
// (flag_for); only the tools know which flag was given.
struct GivenFlags {
  std::vector<Setting> model;  // settings of the model config (Setting::vocab is vocab_size)
  std::vector<Setting> train;  // settings of the training config
  bool seed = false;           // Setting::seed
};

// The run's configs. `model` and `train` are what the flags say (the model's arch, dtype and
// normalize_topk already parsed; train.seed = --seed).
//   Fresh run (`resume` null): the model is resolved (ModelConfig::resolve); train as given. On a
//   token file (.u16/.u32 or data_format) without --vocab, vocab_size is 0: sized from the data.
//   Resumed run: the checkpoint's training config, each training flag given now overriding its
//   key (a longer --steps, another --data); --seed given must equal the checkpoint's seed. The
//   model is the checkpoint's (a resumed run keeps its model): a model flag given must agree
//   with it, nested keys included (--rope-factor is the yarn object's factor; a checkpoint
//   without YaRN has it "off").
// Either way the run needs data. UsageError names the flag: "--seed 7 contradicts the
// checkpoint's seed 1234", "--d-model 64 contradicts the checkpoint's 32 (a resumed run keeps
// its model)", "--data is required (the text or token file to train on)".
RunConfig resume_config(const io::Checkpoint* resume, ModelConfig model, TrainConfig train,
                        const GivenFlags& given);

// A fresh run that starts from a checkpoint's weights (moe-train --init: fine-tuning an imported
// or trained model): training as the flags say (as a fresh run), the model the checkpoint's, each
// model flag given agreeing with it, except the settings that shape training rather than the
// parameters (--aux-loss-coef, --z-loss-coef, --router-jitter, --capacity-factor,
// --balance-bias-rate), which the flags may set anew. A quantised checkpoint is refused.
RunConfig init_config(const io::Checkpoint& init, ModelConfig model, TrainConfig train,
                      const GivenFlags& given);

// The data file's identity (TrainConfig::data_bytes, data_crc32c): a resumed run that read another
// file (moved and edited, replaced, appended to) would not continue the token stream. A fresh run,
// or a resumed one given --data (`data_given`), records the file's size and CRC-32C; when the
// resumed run's file is not the checkpoint's, that is returned as a line for the log ("resume:
// --data FILE is not the file the checkpoint trained on (...)"). A run resumed without --data
// checks the file is the checkpoint's: moe::Error naming the file and what differs (missing, its
// size, its checksum) and saying to pass --data to train on it anyway (or on the moved file).
// A checkpoint of an earlier build (nothing recorded) is only recorded. Returns "" otherwise.
std::string check_data_file(TrainConfig& train, bool resumed, bool data_given);

// A checkpoint resumes on any number of ranks with any layout: Trainer::restore re-shards its
// tensors on load. Its layout settings (--ep, --placement, --shard-embedding, ...) carry over into
// `train` like every training setting unless given again; this fits them to `world_size` ranks.
// On one process, --ep, --placement and --shard-embedding not given fall back to one process's
// (1, static, off: there is nothing to place or shard), and the returned lines say so ("--ep 2 -> 1
// (one process holds every expert)", for the log beside RunConfig::overrides). On several ranks, a
// carried --ep that does not divide the world throws UsageError naming the --ep values that do (the
// user picks the layout; nothing guesses it). `resume` needs its configs and sharding only (a
// sharded checkpoint's rank-00000.h5 holds them).
std::vector<std::string> fit_layout(TrainConfig& train, const io::Checkpoint& resume,
                                    int world_size, const GivenFlags& given);

}  // namespace moe::train
