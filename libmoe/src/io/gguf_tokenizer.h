// The tokenizer a GGUF file describes in its tokenizer.ggml.* keys, rebuilt as the file our
// tokenizer code loads (moe/io/tokenizer.h): the inverse of what the GGUF export reads out of a
// stored tokenizer (io/gguf_write.cpp, write_vocabulary). docs/FORMATS.md ("GGUF import") says
// what each key becomes. Private to libmoe (io/gguf_import.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/gguf_keys.h"
#include "moe/io/checkpoint.h"

namespace moe::io::gguf {

// "gpt2" (byte-level BPE) as a tokenizer.json, "llama" (SentencePiece) as a tokenizer.model; the
// trailing unused "[PAD<id>]" tokens the export pads the vocabulary with are left out. Empty for
// the byte-level vocabulary (256 byte tokens, no merges: a byte-level model needs none) and for
// a vocabulary our tokenizers cannot run (another model or pre-tokenizer): then `notes` says
// why, as import_hf leaves out a tokenizer it cannot read. Keys of the wrong type, or more tokens
// than the model's vocabulary (V), are refused (moe::Error naming the key).
StoredTokenizer tokenizer_from_gguf(const Keys& keys, int64_t V, std::vector<std::string>& notes);

}  // namespace moe::io::gguf
