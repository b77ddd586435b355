// Token files, the byte-level tokenizer, the window sampler and the validation split.
// Shape letters: B batch, T sequence length.
#include "moe/io/dataset.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>

#include "moe/checksum.h"
#include "moe/error.h"
#include "moe/io/input.h"
#include "moe/log.h"
#include "moe/rng.h"
#include "moe/timer.h"

namespace moe::io {

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

std::vector<unsigned char> read_all(std::FILE* file, const std::string& what, size_t expect = 0) {
  std::vector<unsigned char> bytes;
  bytes.reserve(expect);
  unsigned char block[1 << 16];
  size_t got = 0;
  while ((got = std::fread(block, 1, sizeof block, file)) > 0)
    bytes.insert(bytes.end(), block, block + got);
  if (std::ferror(file)) throw Error(str(what, ": read error: ", std::strerror(errno)));
  return bytes;
}

std::vector<unsigned char> read_bytes(const std::string& path) {
  namespace fs = std::filesystem;
  if (path == "-") return read_all(stdin, "token file '-' (stdin)");  // read once, whole
  check_input_file(path, "token file");  // /dev/zero would be read until memory runs out
  FilePtr file(std::fopen(path.c_str(), "rb"));
  if (!file) throw Error(str("token file '", path, "': cannot open: ", std::strerror(errno)));
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  return read_all(file.get(), str("token file '", path, "'"), ec ? 0 : static_cast<size_t>(size));
}

const char* const kSamplerStream = "io.batch_sampler.epoch_permutation";

}  // namespace

std::string FileFingerprint::crc32c_hex() const {
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", crc32c);
  return hex;
}

FileFingerprint fingerprint_file(const std::string& path) {
  check_input_file(path, "data file");
  FilePtr file(std::fopen(path.c_str(), "rb"));
  if (!file) throw Error(str("'", path, "': cannot open: ", std::strerror(errno)));
  FileFingerprint f;
  std::vector<unsigned char> block(size_t{1} << 20);
  size_t got = 0;
  while ((got = std::fread(block.data(), 1, block.size(), file.get())) > 0) {
    f.crc32c = crc32c(block.data(), got, f.crc32c);
    f.bytes += static_cast<int64_t>(got);
  }
  if (std::ferror(file.get())) throw Error(str("'", path, "': read error: ", std::strerror(errno)));
  return f;
}

TokenFormat parse_token_format(std::string_view name) {
  if (name == "auto") return TokenFormat::automatic;
  if (name == "text") return TokenFormat::text;
  if (name == "u16") return TokenFormat::u16;
  if (name == "u32") return TokenFormat::u32;
  throw UsageError(str("unknown token format '", name, "' (expected auto, text, u16 or u32)"));
}

const char* token_format_name(TokenFormat format) {
  switch (format) {
    case TokenFormat::automatic:
      return "auto";
    case TokenFormat::text:
      return "text";
    case TokenFormat::u16:
      return "u16";
    case TokenFormat::u32:
      return "u32";
  }
  return "?";
}

TokenFormat resolve_token_format(const std::string& path, TokenFormat format) {
  if (format != TokenFormat::automatic) return format;
  if (ends_with(path, ".u16")) return TokenFormat::u16;
  if (ends_with(path, ".u32")) return TokenFormat::u32;
  return TokenFormat::text;
}

std::string read_text_file(const std::string& path) {
  const std::vector<unsigned char> bytes = read_bytes(path);
  if (bytes.empty()) throw Error(str("text file '", path, "': empty file, no text"));
  return std::string(bytes.begin(), bytes.end());
}

std::vector<int32_t> load_tokens(const std::string& path, TokenFormat format) {
  Timer timer;
  format = resolve_token_format(path, format);
  std::vector<unsigned char> bytes = read_bytes(path);
  const char* fmt = token_format_name(format);
  if (bytes.empty()) throw Error(str("token file '", path, "' (", fmt, "): empty file, no tokens"));
  std::vector<int32_t> tokens;
  switch (format) {
    case TokenFormat::u16: {
      if (bytes.size() % 2 != 0)
        throw Error(str("token file '", path, "' (u16): odd length ", bytes.size(),
                        " bytes, not a whole number of 2-byte tokens"));
      tokens.resize(bytes.size() / 2);
      for (size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = static_cast<int32_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
      break;
    }
    case TokenFormat::u32: {
      if (bytes.size() % 4 != 0)
        throw Error(str("token file '", path, "' (u32): length ", bytes.size(),
                        " bytes is not a multiple of 4"));
      tokens.resize(bytes.size() / 4);
      for (size_t i = 0; i < tokens.size(); ++i) {
        const unsigned char* b = &bytes[4 * i];
        uint32_t id = static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8) |
                      (static_cast<uint32_t>(b[2]) << 16) | (static_cast<uint32_t>(b[3]) << 24);
        if (id > static_cast<uint32_t>(std::numeric_limits<int32_t>::max()))
          throw Error(str("token file '", path, "' (u32): token ", i, " has id ", id,
                          ", above the largest supported id ",
                          std::numeric_limits<int32_t>::max()));
        tokens[i] = static_cast<int32_t>(id);
      }
      break;
    }
    default:
      tokens.assign(bytes.begin(), bytes.end());
      break;
  }
  MOE_LOG_DEBUG("token file ", path, " (", fmt, "): ", tokens.size(), " tokens in ",
                timer.seconds(), " s");
  return tokens;
}

void check_tokens_fit(const std::vector<int32_t>& tokens, int64_t vocab, const std::string& path) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= vocab)
      throw Error(str(path, ": token ", i, " is ", tokens[i],
                      ", outside the model's vocabulary of ", vocab));
}

void save_tokens(const std::string& path, const std::vector<int32_t>& tokens, TokenFormat format) {
  format = resolve_token_format(path, format);
  const char* fmt = token_format_name(format);
  int64_t limit = format == TokenFormat::text  ? 255
                  : format == TokenFormat::u16 ? 65535
                                               : std::numeric_limits<int32_t>::max();
  size_t width = format == TokenFormat::text ? 1 : format == TokenFormat::u16 ? 2 : 4;
  std::vector<unsigned char> bytes(tokens.size() * width);
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t id = tokens[i];
    if (id < 0 || id > limit)
      throw Error(str("token file '", path, "' (", fmt, "): token ", i, " has id ", id,
                      ", outside 0..", limit));
    uint32_t u = static_cast<uint32_t>(id);
    for (size_t b = 0; b < width; ++b)
      bytes[i * width + b] = static_cast<unsigned char>(u >> (8 * b));
  }
  FilePtr file(std::fopen(path.c_str(), "wb"));
  if (!file) throw Error(str("token file '", path, "': cannot create: ", std::strerror(errno)));
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), file.get()) != bytes.size())
    throw Error(str("token file '", path, "': write error: ", std::strerror(errno)));
  if (std::fclose(file.release()) != 0)
    throw Error(str("token file '", path, "': write error on close: ", std::strerror(errno)));
}

std::string detokenize_bytes(const std::vector<int32_t>& tokens) {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    MOE_CHECK(tokens[i] >= 0 && tokens[i] < kByteVocab, "detokenize_bytes: token ", i, " is ",
              tokens[i], ", not a byte (0..255)");
    text[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
  }
  return text;
}

std::vector<int32_t> tokenize_bytes(std::string_view text) {
  std::vector<int32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

// ---- BatchSampler ------------------------------------------------------------------------------

namespace {

// "the data" or "the data 'train.txt'", how messages name the tokens.
std::string the_data(const std::string& source) {
  return source.empty() ? "the data" : str("the data '", source, "'");
}

}  // namespace

BatchSampler::BatchSampler(const std::vector<int32_t>* tokens, int64_t seq, uint64_t seed,
                           bool shuffle, const std::string& source)
    : tokens_(tokens), seq_(seq), seed_(seed), shuffle_(shuffle) {
  MOE_CHECK(tokens_ != nullptr, "batch sampler: no token vector");
  MOE_USAGE_CHECK(seq_ >= 1, "the sequence length must be >= 1 (got ", seq_, ")");
  int64_t n = static_cast<int64_t>(tokens_->size());
  MOE_CHECK(n >= seq_ + 1, the_data(source), " holds ", n,
            " tokens, too few for a window of sequence length ", seq_, ": it needs ", seq_ + 1);
  num_windows_ = (n - 1) / seq_;
}

const std::vector<int64_t>& BatchSampler::permutation(int64_t epoch) {
  if (epoch == cached_epoch_) return order_;
  order_.resize(static_cast<size_t>(num_windows_));
  for (int64_t i = 0; i < num_windows_; ++i) order_[i] = i;
  // Fisher-Yates driven by counter-based randoms: swap i is a pure function of (seed, epoch, i).
  uint64_t key = rng_key(seed_, {hash_name(kSamplerStream), static_cast<uint64_t>(epoch)});
  for (int64_t i = num_windows_ - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(
        rng_below(key, static_cast<uint64_t>(i), static_cast<uint64_t>(i + 1)));
    std::swap(order_[i], order_[j]);
  }
  cached_epoch_ = epoch;
  return order_;
}

int64_t BatchSampler::window_at(int64_t position) {
  MOE_CHECK(position >= 0, "batch sampler: negative stream position ", position);
  int64_t index = position % num_windows_;
  if (!shuffle_) return index;
  return permutation(position / num_windows_)[static_cast<size_t>(index)];
}

void BatchSampler::next(int64_t batch, Tensor& inputs, Tensor& targets) {
  MOE_USAGE_CHECK(batch >= 1, "the batch must be >= 1 (got ", batch, ")");
  Tensor in = Tensor::empty({batch, seq_}, DType::i32);
  Tensor out = Tensor::empty({batch, seq_}, DType::i32);
  in.set_name("inputs");
  out.set_name("targets");
  int32_t* x = in.data<int32_t>();
  int32_t* y = out.data<int32_t>();
  const int32_t* data = tokens_->data();
  for (int64_t b = 0; b < batch; ++b) {
    int64_t start = window_at(cursor_ + b) * seq_;
    std::copy(data + start, data + start + seq_, x + b * seq_);
    std::copy(data + start + 1, data + start + seq_ + 1, y + b * seq_);
  }
  cursor_ += batch;
  inputs = std::move(in);
  targets = std::move(out);
}

void BatchSampler::set_cursor(int64_t windows_consumed) {
  MOE_CHECK(windows_consumed >= 0, "batch sampler: the cursor must be >= 0 (got ", windows_consumed,
            ")");
  cursor_ = windows_consumed;
}

// ---- split_tail --------------------------------------------------------------------------------

std::pair<std::vector<int32_t>, std::vector<int32_t>> split_tail(std::vector<int32_t> tokens,
                                                                 double fraction, int64_t seq,
                                                                 const std::string& source) {
  MOE_USAGE_CHECK(fraction > 0.0 && fraction < 1.0, "validation fraction must be in (0, 1) (got ",
                  fraction, ")");
  MOE_USAGE_CHECK(seq >= 1, "sequence length must be >= 1 (got ", seq, ")");
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t need = seq + 1;
  MOE_CHECK(n >= 2 * need, the_data(source), " holds ", n,
            " tokens, too few for a training and a validation part of ", need,
            " tokens each (a sequence + 1): need ", 2 * need);
  int64_t val = std::llround(fraction * static_cast<double>(n));
  val = std::min(std::max(val, need), n - need);
  std::vector<int32_t> validation(tokens.end() - val, tokens.end());
  tokens.resize(static_cast<size_t>(n - val));
  return {std::move(tokens), std::move(validation)};
}

}  // namespace moe::io
