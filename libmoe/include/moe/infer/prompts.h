// Prompt files for moe-infer generate: one prompt per line, either plain text (encoded by the
// model's tokenizer with its special tokens, e.g. a BOS; without one, byte tokens) or a
// JSON object {"prompt": "..."} or {"tokens": [ids]}, with optional per-prompt sampling settings
// "max_new", "temperature", "top_k", "top_p", "repeat_penalty", "repeat_last_n" and "stop" (a
// string or a list of strings, replacing the default stop strings) overriding the defaults
// (tools/moe-infer/README.md).
// The sampling settings are checked later, by generate().
#pragma once
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "moe/infer/generate.h"

namespace moe::infer {

struct Prompt {
  std::vector<int32_t> tokens;
  std::string text;       // as given (text prompts)
  int64_t line = 0;       // in the file, from 1 (blank lines counted), for messages
  int64_t truncated = 0;  // tokens cut from its start (infer::truncate_left), for the output
  SamplingConfig sampling;
};

// Reads every line of `in`; `name` stands for the file in messages ("<name>:<line>: ...").
// A trailing '\r' is dropped. Errors (moe::Error): a line that starts with '{' but is not a valid
// prompt object, a text prompt for a model whose vocabulary is below 256 (not byte-level), an
// empty prompt, or no prompt at all. `tokenizer` (may be null) encodes text prompts; with one,
// prompt ids must also be below its vocabulary's end (it decodes them for the output).
std::vector<Prompt> read_prompts(std::istream& in, const std::string& name,
                                 const SamplingConfig& defaults, int64_t vocab_size,
                                 const io::Tokenizer* tokenizer = nullptr);

}  // namespace moe::infer
