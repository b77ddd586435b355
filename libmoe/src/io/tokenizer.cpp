// Loading a tokenizer by file or model directory (see moe/io/tokenizer.h), and GPT-2's
// byte-level alphabet, which the BPE tokenizer and the GGUF export share.
#include "moe/io/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/tokenizer_impl.h"
#include "moe/error.h"

namespace moe::io {

namespace fs = std::filesystem;

namespace {

// Tokenizer files beyond this are refused before they are read (Qwen's tokenizer.json, the
// largest in use, is about 11 MB).
constexpr uintmax_t kMaxTokenizerBytes = uintmax_t(1) << 30;

std::string read_whole(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw Error(str("tokenizer '", path, "' does not exist"));
  if (!fs::is_regular_file(st)) throw Error(str("tokenizer '", path, "' is not a regular file"));
  const uintmax_t size = fs::file_size(path, ec);
  if (ec || size > kMaxTokenizerBytes)
    throw Error(str("tokenizer '", path, "': ", ec ? ec.message() : "larger than 1 GiB"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str("cannot read tokenizer '", path, "': ", std::strerror(errno)));
  std::ostringstream out;
  out << in.rdbuf();
  if (!in.good() && !in.eof()) throw Error(str("cannot read tokenizer '", path, "'"));
  return out.str();
}

}  // namespace

std::string Tokenizer::describe() const {
  return str(file_name_, " (", kind_, ", ", vocab_size(), " tokens)");
}

std::string byte_level_char(uint8_t byte) {
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  };
  int code = byte;
  if (!printable(byte)) {
    code = 256;
    for (int b = 0; b < byte; ++b)
      if (!printable(b)) ++code;
  }
  std::string s;
  if (code < 0x80) {
    s += static_cast<char>(code);
  } else {
    s += static_cast<char>(0xc0 | (code >> 6));
    s += static_cast<char>(0x80 | (code & 0x3f));
  }
  return s;
}

std::unique_ptr<Tokenizer> tokenizer_from_bytes(const std::string& file_name, std::string bytes,
                                                const std::string& where) {
  if (file_name == kTokenizerJson) return detail::make_bpe_tokenizer(std::move(bytes), where);
  if (file_name == kTokenizerModel) return detail::make_spm_tokenizer(std::move(bytes), where);
  throw Error(str(where, ": '", file_name, "' is not a tokenizer file we read (", kTokenizerJson,
                  ", ", kTokenizerModel, ")"));
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const char* name : {kTokenizerModel, kTokenizerJson}) {
      const std::string file = (fs::path(path) / name).string();
      if (fs::exists(file, ec)) return tokenizer_from_bytes(name, read_whole(file), file);
    }
    throw Error(str("'", path, "' holds neither ", kTokenizerModel, " nor ", kTokenizerJson));
  }
  std::string bytes = read_whole(path);
  // A JSON document starts with '{' (after white space); a SentencePiece model is protobuf.
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  const bool json = first != std::string::npos && bytes[first] == '{';
  return tokenizer_from_bytes(json ? kTokenizerJson : kTokenizerModel, std::move(bytes), path);
}

}  // namespace moe::io
