// SentencePiece tokenizers (tokenizer.model: Llama, Mistral, Mixtral) through Debian's
// libsentencepiece: the model's own normaliser, pieces, byte fallback and decoder, exactly as the
// reference implementation runs them (it is the reference implementation).
#include <sentencepiece_processor.h>

#include <memory>

#include "io/tokenizer_impl.h"
#include "moe/error.h"

namespace moe::io::detail {

namespace {

class SpmTokenizer final : public Tokenizer {
 public:
  SpmTokenizer(std::string bytes, const std::string& where)
      : Tokenizer(kTokenizerModel, std::move(bytes), "SentencePiece") {
    const auto status = sp_.LoadFromSerializedProto(file_bytes());
    if (!status.ok())
      throw Error(str("tokenizer '", where, "' is not a SentencePiece model: ", status.ToString()));
    where_ = where;
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    MOE_CHECK(status.ok(), "tokenizer '", where_, "': ", status.ToString());
    std::vector<int32_t> out;
    out.reserve(ids.size() + 1);
    if (add_special && sp_.bos_id() >= 0) out.push_back(sp_.bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<int> in(ids.begin(), ids.end());
    for (size_t i = 0; i < in.size(); ++i)
      MOE_CHECK(in[i] >= 0 && in[i] < sp_.GetPieceSize(), "tokenizer '", where_, "': token id ",
                in[i], " at position ", i, " is outside the vocabulary (", sp_.GetPieceSize(),
                " tokens)");
    std::string text;
    const auto status = sp_.Decode(in, &text);
    MOE_CHECK(status.ok(), "tokenizer '", where_, "': ", status.ToString());
    return text;
  }

  std::vector<VocabEntry> vocabulary() const override {
    std::vector<VocabEntry> out(static_cast<size_t>(sp_.GetPieceSize()));
    for (int id = 0; id < sp_.GetPieceSize(); ++id) {
      VocabEntry& v = out[static_cast<size_t>(id)];
      v.text = sp_.IdToPiece(id);
      v.score = sp_.GetScore(id);
      v.kind = sp_.IsUnknown(id)   ? TokenKind::unknown
               : sp_.IsControl(id) ? TokenKind::control
               : sp_.IsUnused(id)  ? TokenKind::unused
               : sp_.IsByte(id)    ? TokenKind::byte
                                   : TokenKind::normal;
    }
    return out;
  }
  bool sentencepiece() const override { return true; }
  int32_t unk_id() const override { return sp_.unk_id(); }

  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t bos_id() const override { return sp_.bos_id(); }
  int32_t eos_id() const override { return sp_.eos_id(); }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  std::string where_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(std::string bytes, const std::string& where) {
  return std::make_unique<SpmTokenizer>(std::move(bytes), where);
}

}  // namespace moe::io::detail
