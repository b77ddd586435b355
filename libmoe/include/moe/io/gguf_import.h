// GGUF import (moe-convert import-gguf): a GGUF v3 file of llama.cpp's llama (with experts:
// Mixtral), qwen2moe, qwen3moe or olmoe architecture, in f32, f16, bf16, q8_0, q4_K, q6_K or
// MXFP4 tensors (in any mix), as one of
// our checkpoints of the mixtral, qwen2_moe, qwen3_moe or olmoe flavour: the inverse of
// export_gguf (moe/io/gguf.h), and a reader of the files llama.cpp's own converter writes.
// docs/FORMATS.md ("GGUF import") has the key and tensor tables.
//
// The import is planned from the file's header first (keys -> model config, every tensor's name,
// type and dimensions checked against it, the tokenizer rebuilt), so that a file we cannot run is
// refused by name before any tensor is converted; then each tensor becomes one parameter,
// independently of the others (import_gguf_tensor), so a caller may stream them.
//
// Numerics: f32 tensors are kept bitwise; f16 and bf16 ones too when the whole model is in that
// type (the f32 norms, router and biases beside them are then exactly representable in it, as in
// any file exported from a 16-bit model); otherwise everything is stored f32 (exact). q8_0 weight
// matrices become our Q8_0 rows (model_config "quantization": "q8_0", as moe-convert quantize
// writes) holding the file's very int8 values and f16 scales, rearranged; q8_0 tensors we keep
// unquantised (the token embedding) are dequantised, exactly. A file with q4_K, q6_K or MXFP4
// weight matrices becomes a block checkpoint (model_config "tensor_formats", moe/io/convert.h):
// every weight matrix the file holds in blocks, q8_0 ones included, keeps the file's bytes
// (bitwise, no requantisation); the recipe is quantize's name for the same mix (q4_k, q6_k,
// mxfp4, q4_k_m) or "mixed"; the embedding in such a type is dequantised (exact: llama.cpp's row
// lookup dequantises it too); a 4- or 6-bit norm, bias or router is refused by name. q/k rows of
// the llama architecture are un-permuted (its rope rotates adjacent pairs; ours, as HF's, pairs i
// and i + hd/2): whole rows, of values or of blocks.
// Shape letters: V vocabulary, D hidden, H heads, KV kv heads, hd head dim, F expert hidden,
// Fs shared expert hidden, E experts.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"
#include "moe/io/gguf.h"
#include "moe/models/config.h"

namespace moe::io {

struct GgufImportOptions {
  // Our seq = min(A.context_length, max_seq) (0: no cap), as import_hf caps
  // max_position_embeddings; a file our export_gguf wrote keeps its exact seq (moe.model_config).
  int64_t max_seq = 4096;
  // Provenance of the checkpoint; an empty tool is filled with "libmoe import_gguf", this
  // library's version and git revision, and the current time.
  Provenance provenance;
};

struct GgufImportReport {
  std::string architecture;         // general.architecture ("llama", "qwen2moe", ...)
  std::string family;               // our flavour ("mixtral", "qwen2_moe", ...)
  bool quantized = false;           // weight matrices in blocks: a quantised checkpoint
  std::string recipe;               // its recipe (moe/io/convert.h quantization_of), "" none
  std::vector<std::string> mapped;  // "<gguf name> -> <our name>[ (...)]"
  std::vector<std::string> notes;   // decisions: seq cap, dtype, tokenizer, config record
};

// One parameter of the import: where it comes from and what it becomes.
struct GgufTensorPlan {
  std::string gguf, ours;  // "blk.0.attn_q.weight", "blocks.0.attn.q.weight"
  Shape shape;             // ours, unquantised ([E, F, D] for an expert tensor)
  bool expert = false;
  int64_t rope_heads = 0;  // > 0: q/k rows of that many heads, un-permuted (llama)
  bool q8_rows = false;    // stored as our Q8_0 rows (u8 [.., out, q8_row_bytes(in)])
  // Kept in the file's blocks ("q4_k", "q6_k", "mxfp4", "q8_0"; u8 [.., out, row bytes]); "" not.
  std::string block_format;
  // deepseek2's latent attention (io/gguf_import_deepseek2.cpp): the file's tensor is file_shape
  // (empty: `shape`), and ours is its rows `rows` in that order (empty: all of them), or with
  // head_transpose its [heads, c, dn] transposed per head to [heads * dn, c].
  Shape file_shape;
  std::vector<int64_t> rows;
  bool head_transpose = false;
};

struct GgufImportPlan {
  GgufFile file;
  ModelConfig config;                   // resolved; dtype = the stored parameters'
  nlohmann::json model_config;          // to_json(config), with "quantization" when quantised
  std::vector<GgufTensorPlan> tensors;  // our parameters, in the order our model creates them
  StoredTokenizer tokenizer;
};

// Reads and checks the header, decides the dtype (reading the small f32 tensors, and the
// tensors dequantised or converted to it, to see that it holds them exactly) and rebuilds the
// tokenizer. Throws moe::Error naming the file and the key, tensor or type it cannot take.
GgufImportPlan plan_gguf_import(const std::string& path, const GgufImportOptions& options = {},
                                GgufImportReport* report = nullptr);
// One parameter, read and converted (NaN/Inf and damaged Q8_0 scales refused naming it).
NamedTensor import_gguf_tensor(const GgufImportPlan& plan, const GgufTensorPlan& tensor);
// The checkpoint: parameters under our names, model_config, the tokenizer, provenance; no
// optimizer state, train_config null. The parameters are deferred (moe/io/checkpoint.h): each is
// read and converted by import_gguf_tensor when the checkpoint is written (or hold_all() reads
// them), so a file of any size imports in the memory of its largest tensor.
Checkpoint import_gguf(const std::string& path, const GgufImportOptions& options = {},
                       GgufImportReport* report = nullptr);

}  // namespace moe::io
