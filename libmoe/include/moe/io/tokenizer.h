// Tokenizers of the model families we import, so that a model scores and generates text rather
// than token files:
//   - Hugging Face `tokenizer.json` with a byte-level BPE model (GPT-2, Qwen, OLMoE): added and
//     special tokens, NFC normalisation, the pre-tokenizer's own regular expression (run by
//     PCRE2 with Unicode properties), merges by rank, byte fallback, the byte-level decoder;
//   - SentencePiece `tokenizer.model` (Llama, Mistral, Mixtral), through Debian's libsentencepiece.
// Whatever a file asks for that we do not implement (another model type, normaliser,
// pre-tokenizer or decoder) is refused by name when it is loaded, never approximated.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moe::io {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of `text`. add_special: also the tokens the tokenizer's own template adds around a
  // single text (a BOS, for SentencePiece models that define one; tokenizer.json's
  // TemplateProcessing post-processor).
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special = false) const = 0;
  // The text of `ids` (its bytes; a prefix of a generation may end inside a UTF-8 character).
  // An id outside the vocabulary throws naming it.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1: none
  virtual int32_t eos_id() const = 0;  // -1: none
  // "tokenizer.json" or "tokenizer.model": the file name it is read from in a model directory.
  const std::string& file_name() const { return file_name_; }
  // The file's bytes, verbatim (a checkpoint stores them so that the tokenizer travels with it).
  const std::string& file_bytes() const { return bytes_; }
  std::string describe() const;  // e.g. "tokenizer.json (byte-level BPE, 151665 tokens)"

  // The vocabulary as llama.cpp's GGUF files describe it (io/gguf_write.cpp).
  enum class TokenKind : int32_t {
    normal = 1,
    unknown = 2,
    control = 3,
    user_defined = 4,
    unused = 5,
    byte = 6
  };
  struct VocabEntry {
    std::string text;  // as the tokenizer spells it (byte-level characters; "▁" pieces)
    float score = 0;   // SentencePiece's piece score; 0 for BPE
    TokenKind kind = TokenKind::normal;
  };
  virtual std::vector<VocabEntry> vocabulary() const = 0;         // by id
  virtual std::vector<std::string> merges() const { return {}; }  // BPE: "a b", by rank
  virtual bool sentencepiece() const = 0;
  // llama.cpp's name for the BPE pre-tokenizer ("gpt-2", "qwen2"), "" when it has none for it.
  virtual std::string llama_pre_tokenizer() const { return ""; }
  virtual int32_t unk_id() const { return -1; }

 protected:
  Tokenizer(std::string file_name, std::string bytes, std::string kind)
      : file_name_(std::move(file_name)), bytes_(std::move(bytes)), kind_(std::move(kind)) {}

 private:
  std::string file_name_, bytes_, kind_;
};

inline constexpr const char* kTokenizerJson = "tokenizer.json";
inline constexpr const char* kTokenizerModel = "tokenizer.model";

// A tokenizer from a file (tokenizer.json or tokenizer.model, told apart by their content) or a
// directory holding one (a Hugging Face model directory: tokenizer.model is preferred when both
// are there, as for Mixtral, whose tokenizer.json is SentencePiece's in another form). Throws
// moe::Error naming the path and what is wrong or unsupported.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);
// The same from a file's bytes; `where` names them in errors (a checkpoint's path).
std::unique_ptr<Tokenizer> tokenizer_from_bytes(const std::string& file_name, std::string bytes,
                                                const std::string& where);
// GPT-2's byte-level alphabet: byte b as one character, UTF-8. The printable bytes ('!'..'~',
// U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves; the others for U+0100 + their rank.
std::string byte_level_char(uint8_t byte);

}  // namespace moe::io
