// The two tokenizer implementations behind moe/io/tokenizer.h (io/tokenizer_bpe.cpp,
// io/tokenizer_spm.cpp); load_tokenizer (io/tokenizer.cpp) picks one by file.
#pragma once
#include <memory>
#include <string>

#include "moe/io/tokenizer.h"

namespace moe::io::detail {

// `bytes` is a tokenizer.json; `where` names it in errors.
std::unique_ptr<Tokenizer> make_bpe_tokenizer(std::string bytes, const std::string& where);
// `bytes` is a SentencePiece model (a serialised ModelProto).
std::unique_ptr<Tokenizer> make_spm_tokenizer(std::string bytes, const std::string& where);

}  // namespace moe::io::detail
