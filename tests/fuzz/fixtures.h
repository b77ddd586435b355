// Small valid files made by libmoe's own writers: the seed corpora (make_corpus) and the fixed
// surroundings some targets need (an HF directory around a fuzzed config.json, a trace to check a
// fuzzed path table against).
// Shape letters: N tokens, L MoE layers, k top-k, E experts of a layer.
#pragma once
#include <string>

#include "moe/io/checkpoint.h"
#include "moe/models/config.h"

namespace moe::fuzz {

// A tiny model (`layers` blocks, all MoE with E = 4, k = 2, d_model 8, vocab 32, seq 16),
// resolved.
ModelConfig tiny_model_config(Arch arch, int64_t layers = 2);
// Its freshly initialised parameters as a checkpoint (no optimizer state unless `with_optim`).
io::Checkpoint tiny_checkpoint(Arch arch, bool with_optim = false, int64_t layers = 2);
// A trace of the tiny gpt model: `batches` batches of 16 tokens with varied routing.
void write_tiny_trace(const std::string& path, int64_t batches = 2);
// The tiny mixtral model exported as a Hugging Face directory (config.json + model.safetensors);
// with `sharded`, its tensors are split over two shards named by model.safetensors.index.json.
void write_tiny_hf(const std::string& dir, bool sharded);

}  // namespace moe::fuzz
