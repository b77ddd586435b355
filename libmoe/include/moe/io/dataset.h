// Token datasets: token files (text through a byte-level tokenizer, or raw little-endian u16/u32
// ids), fixed-length training windows sampled in a deterministic per-epoch order, and the
// train/validation tail split. Formats: docs/FORMATS.md ("Token files").
//
// Shape letters: B batch (windows per call), T sequence length (`seq`).
// A window is seq+1 consecutive tokens; window w starts at token w*seq, so consecutive windows
// share one token and every token but the first is a target exactly once per epoch.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moe/tensor.h"

namespace moe::io {

enum class TokenFormat { automatic, text, u16, u32 };

// "auto" | "text" | "u16" | "u32"; UsageError naming the accepted values otherwise.
TokenFormat parse_token_format(std::string_view name);
const char* token_format_name(TokenFormat format);
// automatic -> by extension: ".u16" / ".u32", anything else text.
TokenFormat resolve_token_format(const std::string& path, TokenFormat format);

inline constexpr int32_t kByteVocab = 256;  // the byte-level tokenizer's vocabulary

// A file's size and CRC-32C (its identity for a resumed run), read in blocks. moe::Error naming
// the path when it cannot be read.
struct FileFingerprint {
  int64_t bytes = 0;
  uint32_t crc32c = 0;
  std::string crc32c_hex() const;  // 8 lower-case hex digits, as checkpoints record it
};
FileFingerprint fingerprint_file(const std::string& path);

// text: every byte is a token (0..255); u16/u32: little-endian token ids.
// Missing / empty file, u16 file of odd length, u32 file whose length is not a multiple of 4, or
// a u32 id above INT32_MAX -> moe::Error naming the path and the cause.
std::vector<int32_t> load_tokens(const std::string& path,
                                 TokenFormat format = TokenFormat::automatic);
// A text file's bytes (for a tokenizer to encode); errors as load_tokens's ("-": stdin).
std::string read_text_file(const std::string& path);
// Every token id below `vocab`, else moe::Error "<path>: token i is X, outside the model's
// vocabulary of V" (files read for an existing model).
void check_tokens_fit(const std::vector<int32_t>& tokens, int64_t vocab, const std::string& path);

// Writes tokens in `format` (automatic -> by extension). text requires ids in 0..255, u16 ids in
// 0..65535; throws naming the first token that does not fit.
void save_tokens(const std::string& path, const std::vector<int32_t>& tokens,
                 TokenFormat format = TokenFormat::automatic);
// Byte-level inverse of text tokenization; throws on an id outside 0..255 naming its position.
std::string detokenize_bytes(const std::vector<int32_t>& tokens);
// Byte-level tokenization of a string (what load_tokens does to a text file's bytes).
std::vector<int32_t> tokenize_bytes(std::string_view text);

// Fixed-length windows of seq+1 tokens (inputs = first seq, targets = last seq) starting every
// `seq` tokens. With `shuffle`, each epoch visits the windows in a permutation keyed by
// (seed, epoch) (Philox, moe/rng.h); without, in file order. The whole stream is a pure function
// of (tokens, seq, seed, shuffle, cursor): set_cursor() resumes it exactly.
class BatchSampler {
 public:
  // `tokens` must outlive the sampler. Throws if it holds fewer than seq+1 tokens, naming
  // `source` (the data file the tokens came from) when given.
  BatchSampler(const std::vector<int32_t>* tokens, int64_t seq, uint64_t seed, bool shuffle = true,
               const std::string& source = "");

  int64_t num_windows() const { return num_windows_; }
  int64_t seq() const { return seq_; }

  // Next `batch` windows: inputs [B,T] i32 and targets [B,T] i32 (fresh tensors). Crosses epochs
  // seamlessly.
  void next(int64_t batch, Tensor& inputs, Tensor& targets);
  // The window (index into file order) served at stream position `position` (>= 0).
  int64_t window_at(int64_t position);

  int64_t cursor() const { return cursor_; }  // windows consumed since the start of epoch 0
  void set_cursor(int64_t windows_consumed);  // resume exactly
  int64_t epoch() const { return cursor_ / num_windows_; }

 private:
  const std::vector<int64_t>& permutation(int64_t epoch);

  const std::vector<int32_t>* tokens_;
  int64_t seq_;
  uint64_t seed_;
  bool shuffle_;
  int64_t num_windows_ = 0;
  int64_t cursor_ = 0;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> order_;  // permutation of the cached epoch (window indices)
};

// Split for validation (when there is no --val file): the last `fraction` of the tokens,
// rounded to nearest, but at least seq+1 tokens, while leaving the training part at least seq+1.
// Returns {train, validation}. UsageError for fraction outside (0, 1); Error when fewer than
// 2*(seq+1) tokens make both parts impossible, naming `source` (the data file) when given.
std::pair<std::vector<int32_t>, std::vector<int32_t>> split_tail(std::vector<int32_t> tokens,
                                                                 double fraction, int64_t seq,
                                                                 const std::string& source = "");

}  // namespace moe::io
