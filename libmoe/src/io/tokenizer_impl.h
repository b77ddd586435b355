// The two tokenizer implementations behind moe/io/tokenizer.h (io/tokenizer_bpe.cpp,
// io/tokenizer_spm.cpp); load_tokenizer (io/tokenizer.cpp) picks one by file.
#pragma once
#include <memory>
#include <string>

#include "moe/io/tokenizer.h"

namespace moe::io::detail {

// Qwen2's (and Qwen3's) pre-tokenizer expression, a Split step of its tokenizer.json; llama.cpp
// calls the pre-tokenizer that runs it "qwen2" (the GGUF export names it, the import rebuilds it).
inline constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// OpenAI's o200k (tiktoken's o200k_base pat_str: GPT-4o, gpt-oss), a Split step of gpt-oss's
// tokenizer.json; llama.cpp's "gpt-4o".
inline constexpr const char* kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// GPT-2's, the ByteLevel pre-tokenizer's own (use_regex); llama.cpp's "gpt-2".
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// `bytes` is a tokenizer.json; `where` names it in errors.
std::unique_ptr<Tokenizer> make_bpe_tokenizer(std::string bytes, const std::string& where);
// `bytes` is a SentencePiece model (a serialised ModelProto).
std::unique_ptr<Tokenizer> make_spm_tokenizer(std::string bytes, const std::string& where);

}  // namespace moe::io::detail
