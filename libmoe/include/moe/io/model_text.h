// Text as a model reads it: through the tokenizer the model carries (import-hf keeps the source
// directory's in the checkpoint), or one named by the user, else every byte a token. Every tool
// that reads text data or text prompts for a model opens its tokenizer here, so that training,
// scoring, profiling and distillation cut the same text into the same ids.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"
#include "moe/io/dataset.h"
#include "moe/io/tokenizer.h"

namespace moe::io {

// The tokenizer of a stored one (`where` names the checkpoint in errors); nullptr when `stored`
// is empty (a byte-level model). One with more tokens than `vocab` is a UsageError naming both.
std::unique_ptr<Tokenizer> stored_model_tokenizer(const StoredTokenizer& stored, int64_t vocab,
                                                  const std::string& where);
// The tokenizer a model at `model_path` (a checkpoint file, run directory or sharded directory)
// reads text through: `override_path` (a tokenizer file or a directory holding one) when not
// empty, else the one stored in the checkpoint, else nullptr. Logs which one it is.
std::unique_ptr<Tokenizer> open_model_tokenizer(const std::string& model_path, int64_t vocab,
                                                const std::string& override_path = "");
// The ids of a data file: a text file (by `format`, automatic: by extension) through `tokenizer`
// when there is one, else io::load_tokens. An empty text is a moe::Error naming the path.
std::vector<int32_t> load_model_tokens(const std::string& path, TokenFormat format,
                                       const Tokenizer* tokenizer);

}  // namespace moe::io
