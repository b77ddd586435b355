// Routing traces: per token and MoE layer, the experts the router chose and their gate weights,
// plus per-batch expert loads, in one HDF5 file. docs/FORMATS.md ("Routing trace, version 1") is
// the contract.
//
// Shape letters: N tokens, L MoE layers, k top-k (choices per token and layer), E experts of a
// layer, Emax the largest E over the layers (PR-MoE layers may differ), B batches (forward passes).
//
// The writer streams: every append() extends the datasets on disk and keeps nothing in memory, so
// a trace of any length costs the same memory. Writes are atomic like checkpoints (temp file,
// fsync, rename, fsync dir); path "-" builds the file in memory and close() writes its bytes to a
// FILE* (stdout). The reader checks format, version and every dataset's shape when it opens the
// file, then reads token rows on demand (hyperslabs), so long traces can be streamed in blocks.
// Every failure is a moe::Error naming the file and the cause. Both classes hold an open HDF5
// file; each call takes the process-wide HDF5 lock (h5::Session).
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"

namespace moe::io {

inline constexpr const char* kTraceFormat = "moe.trace";
inline constexpr int kTraceVersion = 1;

struct TraceInfo {
  nlohmann::json model_config;  // the model the trace came from (stored as a JSON string attribute)
  Provenance provenance;        // an empty time is filled with the current UTC time
  int64_t top_k = 0;            // k: choices per token and MoE layer (>= 1, <= every layer's E)
  std::vector<int64_t> moe_blocks;  // [L] block index of each MoE layer (>= 0, increasing)
  std::vector<int64_t> experts;     // [L] experts of each MoE layer (PR-MoE layers may differ)
  std::string source;               // "record" (moe-profile record) or "train" (moe-train --trace)

  int64_t layers() const { return static_cast<int64_t>(experts.size()); }  // L
  int64_t max_experts() const;                                             // Emax (0 when L = 0)
};

// One forward pass (batch) of N tokens. L = moe layers, k = top_k, Emax = max of info.experts.
struct TraceBatch {
  int64_t step = -1;               // training step (moe-train); -1 for moe-profile record
  std::vector<int32_t> token_ids;  // [N]
  std::vector<int32_t> experts;    // [N, L, k] token-major: index (t * L + l) * k + j
  std::vector<float> gates;        // [N, L, k] gate weights
  // [L, Emax]: assignments (token, choice) per expert before capacity; 0 beyond a layer's E
  std::vector<int64_t> loads;
  std::vector<int64_t> dropped;  // [L] assignments dropped by capacity
  int64_t tokens() const { return static_cast<int64_t>(token_ids.size()); }
};

class TraceWriter {
 public:
  // path "-": the file is written to a temporary file in $TMPDIR and close() streams its bytes
  // (the file image) to `image_out` (stdout by default), then removes it. Any other path:
  // written as path.tmp-<pid> and renamed over path by close() (atomic, fsync'ed like checkpoints);
  // a writer destroyed without close() removes its temporary file. chunk_tokens: rows per chunk of
  // the token datasets. Validates the info (L >= 1, sizes agree, 1 <= k <= E of every layer,
  // source).
  TraceWriter(const std::string& path, const TraceInfo& info, int64_t chunk_tokens = 4096,
              std::FILE* image_out = stdout);
  ~TraceWriter();
  TraceWriter(TraceWriter&&) noexcept;
  TraceWriter& operator=(TraceWriter&&) noexcept;

  // Validates every size and value range against the info (a clear moe::Error naming what is
  // wrong, e.g. an expert id outside [0, E of that layer)); a refused batch appends nothing. Then
  // extends the datasets and writes the batch: nothing is kept in memory between appends, so
  // memory stays flat however long the trace. A failed HDF5 write leaves the writer unusable
  // (append and close throw; the temporary file is removed when the writer is destroyed).
  void append(const TraceBatch& batch);
  // Finishes the file (rename, or writes the image); a second close() does nothing.
  void close();
  int64_t tokens() const;
  int64_t batches() const;
  const TraceInfo& info() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class TraceReader {
 public:
  // Opens and validates the file (format, version, attributes, every dataset's shape and type,
  // sum of batch token counts). "-": reads stdin to EOF and opens the bytes as an in-memory file
  // image.
  explicit TraceReader(const std::string& path);
  static TraceReader from_image(std::string bytes, const std::string& name);  // name for messages
  ~TraceReader();
  TraceReader(TraceReader&&) noexcept;
  TraceReader& operator=(TraceReader&&) noexcept;

  const TraceInfo& info() const;
  const std::string& name() const;  // the path (or image name) used in messages
  int64_t tokens() const;           // N
  int64_t batches() const;          // B
  int64_t layers() const;           // L
  int64_t max_experts() const;      // Emax
  // Tokens [begin, end): experts (and optionally gates, token ids), token-major [n, L, k]; reads
  // only those rows (hyperslab), so callers can stream a long trace in blocks. Expert ids read are
  // checked against [0, E of their layer).
  void read_tokens(int64_t begin, int64_t end, std::vector<int32_t>& experts,
                   std::vector<float>* gates = nullptr,
                   std::vector<int32_t>* token_ids = nullptr) const;
  std::vector<int64_t> batch_steps() const;    // [B]
  std::vector<int64_t> batch_tokens() const;   // [B]
  std::vector<int64_t> batch_offsets() const;  // [B + 1]: first token of each batch, then N
  std::vector<int64_t> loads() const;          // [B, L, Emax]
  // Each layer's expert loads summed over all batches: [L][experts of layer l].
  std::vector<std::vector<int64_t>> summed_loads() const;
  std::vector<int64_t> dropped() const;  // [B, L]
  // Batch b whole (its tokens, loads and dropped counts), as it was appended.
  TraceBatch read_batch(int64_t b) const;

 private:
  struct Impl;
  explicit TraceReader(std::unique_ptr<Impl> impl);
  const Impl& impl() const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe::io
