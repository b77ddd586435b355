// Batched autoregressive generation with a KV cache (moe-infer generate). Prompts go through the
// model `batch` at a time: one prefill of the batch's prompts (a ragged batch: no padding, every
// token routed is a real one), then one token per unfinished prompt per step, each row attending
// to its own cached prefix (Transformer::forward_cached). Before sampling, llama.cpp's repetition
// penalty may reshape a row's logits; after it, stop strings may end the row.
// Shapes: P prompts, B batch, V vocabulary, S the model's context (config().seq).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moe/io/tokenizer.h"
#include "moe/models/transformer.h"

namespace moe::infer {

struct SamplingConfig {
  int64_t max_new = 64;    // new tokens per prompt at most
  double temperature = 0;  // 0: greedy (argmax, lowest id on ties)
  int64_t top_k = 0;       // 0: off
  double top_p = 1.0;      // nucleus; 1: off
  uint64_t seed = 0;
  // llama.cpp's repetition penalty: the logits of the tokens among the last repeat_last_n of the
  // sequence (prompt included) are divided by repeat_penalty when positive, multiplied when not.
  double repeat_penalty = 1.0;  // 1: off (the logits are not touched)
  int64_t repeat_last_n = 64;   // 0: off; -1: the whole sequence
  // Generation ends when the decoding of the new tokens contains one of these; the output stops
  // before it. The decoding is the tokenizer's, or without one byte-level (vocabulary <= 256:
  // token t is byte t; other models need a tokenizer for stop strings).
  std::vector<std::string> stop = {};  // "= {}": brace-initialised configs may leave it out
  // The model's tokenizer (may be null): decodes for stop strings and Generation::text, and its
  // end-of-text token (Tokenizer::eos_id) ends a generation. Ids at or past its vocabulary's end
  // (a model vocabulary padded beyond the tokenizer's) are never drawn.
  const io::Tokenizer* tokenizer = nullptr;
};

struct Generation {
  // The new tokens. With a stop string: byte-level, those before it (it starts at a token: one
  // byte each); with a tokenizer, through the token that completed it (text is cut before it).
  // The end-of-text token is not included.
  std::vector<int32_t> tokens;
  std::string text;  // with a tokenizer: the decoded new tokens, cut before a stop string
  // "max_new" (max_new tokens generated; also when the context fills at the same token),
  // "context" (prompt + new tokens reached the model's context length config().seq), "stop"
  // (a stop string appeared; it wins over the other two at the same token), or "eos" (the
  // tokenizer's end-of-text token was drawn).
  std::string stop;
  std::string stop_text;  // the stop string that ended it ("stop" only)
  // OpenAI's and llama.cpp's name for why it ended: "stop" (a stop string) or "length".
  const char* finish_reason() const { return stop == "stop" || stop == "eos" ? "stop" : "length"; }
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
// token id outside the vocabulary, repeat_penalty not > 0, repeat_last_n < -1, an empty stop
// string, stop strings for a model that is not byte-level. Prompt indices N count from 0.
// Non-finite logits: moe::Error. With the defaults (repeat_penalty 1, no stop) the outputs are
// bitwise those of generation without these features.
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

// llama.cpp's repetition penalty on logits[vocab]: every distinct token of `recent` (ids outside
// [0, vocab) ignored) has its logit divided by `penalty` when positive, multiplied when negative
// or zero, once however often it occurs. In float, as llama.cpp. penalty 1: nothing changes.
void apply_repeat_penalty(float* logits, int64_t vocab, std::span<const int32_t> recent,
                          double penalty);

// The tokens the penalty looks at: the last `last_n` of prompt + generated (-1: all of them).
std::vector<int32_t> recent_tokens(std::span<const int32_t> prompt,
                                   std::span<const int32_t> generated, int64_t last_n);

// Stop strings over a text that grows a piece at a time (the decoded new tokens): finds a stop
// string as soon as the text holds one, wherever the pieces cut it.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Appends `piece`; true when the text now contains a stop string (then see cut(), matched()).
  // Only the tail a match could end in is searched, so a whole generation costs O(text x stops).
  bool feed(std::string_view piece);
  size_t cut() const { return cut_; }  // the text's length before the earliest stop string
  const std::string& matched() const { return matched_; }
  const std::string& text() const { return text_; }

 private:
  std::vector<std::string> stops_;
  size_t longest_ = 0, cut_ = 0;
  std::string text_, matched_;
};

// --truncate left: cuts `prompt` to its last max(1, context - max_new) tokens (at most
// context - 1, for max_new 0) when it is longer, so that max_new new tokens fit in the context (a
// prompt of `context` tokens or more is refused by generate()). Returns the number of tokens
// dropped (0: unchanged).
int64_t truncate_left(std::vector<int32_t>& prompt, int64_t context, int64_t max_new);

}  // namespace moe::infer
