// A model for inference: a Transformer with the parameters of a checkpoint file.
#pragma once
#include <memory>
#include <string>

#include "moe/io/checkpoint.h"
#include "moe/models/transformer.h"

namespace moe::infer {

struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<ParamSet> params;
  std::unique_ptr<Transformer> model;
  io::Provenance provenance;  // of the checkpoint
  int64_t step = 0;           // training steps it had taken
};

// Reads `path` (one checkpoint file; a sharded checkpoint directory is refused with a message)
// and builds its model. With `experts` false the expert tensors are not read (an ExpertRing
// streams them); they keep their initial values until something replaces them.
// Throws moe::Error naming the file for a missing/damaged file or a tensor that does not fit.
// With `parallel` (expert parallelism: nn::Parallel::experts set), this rank's experts are read
// one chunk each (io::read_expert) into its slices of the expert tensors; with a placement policy
// (nn::Parallel::placement) every rank holds and reads every expert.
LoadedModel load_model(const std::string& path, bool experts = true,
                       const nn::Parallel* parallel = nullptr);

}  // namespace moe::infer
