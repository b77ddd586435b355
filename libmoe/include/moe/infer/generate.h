// Batched autoregressive generation with a KV cache (moe-infer generate). Prompts go through the
// model `batch` at a time: one prefill of the batch's prompts (a ragged batch: no padding, every
// token routed is a real one), then one token per unfinished prompt per step, each row attending
// to its own cached prefix (Transformer::forward_cached).
// Shapes: P prompts, B batch, V vocabulary.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moe/models/transformer.h"

namespace moe::infer {

struct SamplingConfig {
  int64_t max_new = 64;    // new tokens per prompt at most
  double temperature = 0;  // 0: greedy (argmax, lowest id on ties)
  int64_t top_k = 0;       // 0: off
  double top_p = 1.0;      // nucleus; 1: off
  uint64_t seed = 0;
};

struct Generation {
  std::vector<int32_t> tokens;  // the new tokens
  // "max_new" (max_new tokens generated; also when the context fills at the same token), or
  // "context" (prompt + new tokens reached the model's context length config().seq).
  std::string stop;
};

// Generates for every prompt, `batch` prompts at a time (prompts of different lengths share a
// batch); returns in input order. Uses a KV cache: one prefill of each prompt, then one token per
// step. Sampling randomness is Philox keyed by (seed, prompt index, position) (see sample_token),
// so a prompt's output does not depend on `batch` or on the other prompts. hooks (may be null)
// are called around every block of every forward step (benchmarks time blocks with them). Outputs
// are bitwise independent of `batch` as long as BLAS computes a GEMM row the same whatever the
// other rows (OpenBLAS does; the tests check it) and the model is dropless: with capacity_factor >
// 0 the MoE layers drop by capacity over each step's tokens, so the batch then matters (as it does
// for the full forward). Errors (moe::UsageError): batch < 1, a bad sampling setting (max_new < 0,
// temperature < 0, top_k < 0, top_p outside (0, 1]), an empty prompt ("prompt N is empty"), a
// prompt of config().seq tokens or more ("prompt N has T tokens; the model's context is S"), a
// token id outside the vocabulary. Prompt indices N count from 0. Non-finite logits: moe::Error.
std::vector<Generation> generate(const Transformer& model,
                                 const std::vector<std::vector<int32_t>>& prompts,
                                 const SamplingConfig& sampling, int64_t batch,
                                 const BlockHooks* hooks = nullptr);

// Philox key of prompt `prompt`'s sampling: rng_key(seed, {hash_name("generate"), prompt}).
uint64_t sampling_key(uint64_t seed, int64_t prompt);

// One token from logits[vocab] (finite): greedy when temperature == 0; otherwise softmax of
// logits / temperature (in double) restricted to the top_k largest (ties: lower id first), then to
// the smallest prefix of those, sorted descending, whose mass reaches top_p, renormalised, and
// drawn with rng_uniform(key, position). `position` is the new token's position in its sequence.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingConfig& sampling,
                     uint64_t key, int64_t position);

}  // namespace moe::infer
