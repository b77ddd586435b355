// Text as a model reads it (moe/io/model_text.h).
#include "moe/io/model_text.h"

#include "moe/error.h"
#include "moe/io/checkpoint_dir.h"
#include "moe/log.h"

namespace moe::io {

namespace {

void check_fits(const Tokenizer& tok, int64_t vocab, const std::string& where) {
  MOE_USAGE_CHECK(tok.vocab_size() <= vocab, where, ": ", tok.describe(),
                  " has more tokens than the model's vocabulary (", vocab, ")");
}

}  // namespace

std::unique_ptr<Tokenizer> stored_model_tokenizer(const StoredTokenizer& stored, int64_t vocab,
                                                  const std::string& where) {
  if (stored.empty()) return nullptr;
  std::unique_ptr<Tokenizer> tok = tokenizer_from_bytes(stored.file, stored.bytes, where);
  check_fits(*tok, vocab, str("the tokenizer stored in ", where));
  return tok;
}

std::unique_ptr<Tokenizer> open_model_tokenizer(const std::string& model_path, int64_t vocab,
                                                const std::string& override_path) {
  if (!override_path.empty()) {
    std::unique_ptr<Tokenizer> tok = load_tokenizer(override_path);
    check_fits(*tok, vocab, override_path);
    MOE_LOG_INFO("tokenizer: ", tok->describe());
    return tok;
  }
  const std::string file = checkpoint_files({model_path}).at(0);
  std::unique_ptr<Tokenizer> tok = stored_model_tokenizer(read_tokenizer(file), vocab, file);
  if (tok) MOE_LOG_INFO("tokenizer: ", tok->describe(), " (stored in the model)");
  return tok;
}

std::vector<int32_t> load_model_tokens(const std::string& path, TokenFormat format,
                                       const Tokenizer* tokenizer) {
  if (!tokenizer || resolve_token_format(path, format) != TokenFormat::text)
    return load_tokens(path, format);
  std::vector<int32_t> ids = tokenizer->encode(read_text_file(path));
  MOE_CHECK(!ids.empty(), "'", path, "': no tokens (an empty text)");
  return ids;
}

}  // namespace moe::io
