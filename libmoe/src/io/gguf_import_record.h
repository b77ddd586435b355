// GGUF import: the model config our export records (moe.model_config), taken when its math
// agrees with the file's keys (see io/gguf_import.cpp). Private to libmoe.
#pragma once
#include "io/gguf_keys.h"
#include "moe/io/gguf_import.h"
#include "moe/models/config.h"

namespace moe::io::gguf {

// A file our export_gguf wrote records our exact model config (moe.model_config): taken when it
// agrees with the keys (`mc`, from them), so seq and the training settings come back exactly; a
// note in `rep` says which. Then `mc` is resolved (moe::Error naming the file otherwise).
void adopt_record(const Keys& k, ModelConfig& mc, GgufImportReport& rep);

}  // namespace moe::io::gguf
