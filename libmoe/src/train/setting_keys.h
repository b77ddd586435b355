// Where each setting lands in a checkpoint's configs. A run that resumes (or starts from a
// checkpoint's weights) compares or overrides the settings given now by their config keys
// (train/resume.cpp); messages name them by their flags (flag_for). One table, beside the
// settings table (moe/settings.h) rather than in it: the flags are the tools', the keys the
// library's files'.
#pragma once
#include "moe/settings.h"

namespace moe::train {

// The config whose key a setting sets: the model's (to_json(ModelConfig)) or the training run's
// (to_json(TrainConfig)).
enum class SettingConfig { model, train };

// The key `setting` sets in `config`'s JSON, as a JSON pointer: "/d_model", "/vocab_size"
// (Setting::vocab), "/router_scoring" (Setting::router), "/yarn/factor" (YaRN's settings sit in
// the model's yarn object). nullptr when the setting sets no key of that config.
const char* config_key(Setting setting, SettingConfig config);

}  // namespace moe::train
