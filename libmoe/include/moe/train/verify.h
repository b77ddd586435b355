// moe-convert inspect --verify: a checkpoint passes only when the loaders would take it.
#pragma once
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"

namespace moe::train {

// The checks moe-train --resume makes when it loads `ckpt`, beyond those of io::load_checkpoint:
// its parameters against the model its model_config builds (io::check_params_match, the trainer's
// own check) and, when it holds optimizer state, that state through AdamW::load_state (the
// trainer's own loader). A checkpoint without optimizer state (moe-convert freeze) is an inference
// checkpoint and passes. Throws moe::Error naming `source` and the tensor.
void verify_loadable(const io::Checkpoint& ckpt, const std::string& source);

// Opens `paths` (io::open_whole: one file lazily, or a sharded checkpoint merged), reading and
// checksumming every chunk, then verify_loadable. An inference checkpoint (no optimizer state)
// is read one tensor at a time; optimizer state is held whole for AdamW::load_state. Same inputs
// as io::checkpoint_files.
void verify_checkpoint(const std::vector<std::string>& paths);

}  // namespace moe::train
