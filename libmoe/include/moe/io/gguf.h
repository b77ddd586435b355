// GGUF (version 3), the file format llama.cpp runs: export of our mixtral flavour under
// llama.cpp's "llama" architecture with experts (its Mixtral layout), and a reader of our own for
// tests and inspection. docs/FORMATS.md ("GGUF export") has the names, keys and layouts.
//
// Layout of a file: "GGUF", version u32 = 3, tensor count u64, key/value count u64; the key/value
// pairs (key string, value type u32, value); the tensor infos (name, dimension count u32,
// dimensions u64 fastest-varying first, tensor type u32, data offset u64); zero padding to the
// alignment (general.alignment, 32); the tensor data, each tensor starting aligned. Strings are
// u64 length + bytes; everything little-endian.
//
// Shape letters: V vocabulary, D hidden size, F expert hidden width, E experts of a layer,
// H query heads, KV key/value heads, hd = D / H head dim.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"

namespace moe::io {

// Tensor types (ggml's numbering) that export_gguf writes and read_gguf dequantises. q4_k, q6_k
// and mxfp4 are llama.cpp's block formats (backend/cpu/quant_blocks.h has their bytes).
enum class GgufType : uint32_t { f32 = 0, f16 = 1, q8_0 = 8, q4_k = 12, q6_k = 14, bf16 = 30,
                                 mxfp4 = 39 };
const char* gguf_type_name(GgufType t);
// ggml's name of any tensor type number ("q4_K", "iq2_xxs"), nullptr for numbers ggml does not
// define: a file holding a type this build does not read is refused naming it.
const char* ggml_type_name(uint32_t type);
// "f32", "f16", "bf16", "q8_0", "q4_k", "q6_k", "mxfp4"; throws UsageError naming the accepted
// ones.
GgufType parse_gguf_type(const std::string& name);
// Whether `t` is one of llama.cpp's 4/6-bit block formats (q4_k, q6_k, mxfp4).
bool is_block_type(GgufType t);

// Q8_0: blocks of 32 consecutive values of a row, each stored as an f16 scale d = max|x| / 127
// followed by 32 int8 q = round(x / d) (half away from zero; all zero when d = 0): 34 bytes.
inline constexpr int64_t kQ8Block = 32;
inline constexpr int64_t kQ8BlockBytes = 34;
// Quantises n values (n a multiple of kQ8Block) into n / 32 blocks at `out`.
void quantize_q8_0(const float* x, int64_t n, uint8_t* out);
// The inverse: d * q per value.
void dequantize_q8_0(const uint8_t* blocks, int64_t n, float* out);

struct GgufExportOptions {
  // Type of the matrices (attention, experts, embedding, head). Norm weights and the router stay
  // f32, as llama.cpp's converter keeps them; with q8_0 (mxfp4), a matrix whose rows are not a
  // multiple of 32 values is written f16, with q4_k or q6_k one whose rows are not a multiple of
  // 256. Block types are quantised by our own quantisers, which give llama.cpp's reference bytes.
  GgufType type = GgufType::f32;
  std::string name;  // general.name
  // llama.cpp's Q4_K_M mix instead of one type (type is then q4_k): q6_k for output.weight and,
  // in the layers llama.cpp's use_more_bits picks, for attn_v and ffn_down_exps.
  bool q4_k_m = false;
  // Types of single matrices by GGUF name, over `type` and the Q4_K_M choice (as llama-quantize's
  // --tensor-type; e.g. {"blk.0.attn_k.weight": q8_0} makes llama.cpp's 8-expert Q4_K_M mixes).
  // Rows that are not whole blocks of it still fall back to f16; a name that is not one of the
  // file's matrices (a norm, the router, a misspelling) is an Error.
  std::map<std::string, GgufType> tensor_types = {};
};

struct GgufExportSummary {
  int64_t tensors = 0, keys = 0, bytes = 0;
  std::vector<std::string> fallbacks;  // tensors written in another type than asked, and why
  // What a reader of the file should know that is not about a tensor's type (gpt-oss: llama.cpp
  // rounds YaRN's correction range, which transformers' truncate false does not).
  std::vector<std::string> notes;
};

// Writes `ckpt` (a whole, unsharded mixtral-flavour checkpoint with experts in every layer) to
// `path` atomically. The query and key rows are permuted within each head so that llama.cpp's
// rotary embedding of adjacent pairs equals ours of pairs (i, i + hd/2). Refuses by name what
// llama.cpp's llama architecture cannot hold (the gpt flavour, dense layers, PR-MoE, shards,
// unnormalised top-k) and vocabularies it cannot describe: a byte-level model (V = 256) carries
// its vocabulary as 256 byte tokens; a checkpoint holds no other tokenizer yet.
GgufExportSummary export_gguf(const Checkpoint& ckpt, const std::string& path,
                              const GgufExportOptions& options);

// ---- reading ----------------------------------------------------------------------------------

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // fastest-varying first (ggml's ne)
  GgufType type = GgufType::f32;
  uint64_t offset = 0;  // from the start of the data section
  int64_t numel() const;
  int64_t nbytes() const;
};

struct GgufFile {
  std::string path;
  uint32_t version = 0;
  // Every key: {"type": value type number, "value": the value}; arrays as JSON arrays, with
  // "element_type" too.
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
  std::vector<GgufTensorInfo> tensors;
  uint64_t alignment = 32, data_offset = 0, file_size = 0;
  const GgufTensorInfo& tensor(const std::string& name) const;  // throws naming the file
};

// Reads the header and the tensor infos, checking them against the file's size (a truncated or
// corrupted file is refused with the offset where it goes wrong).
GgufFile read_gguf(const std::string& path);
// A tensor's values as f32 (f16, bf16 and q8_0 converted), in file order.
std::vector<float> read_gguf_tensor(const GgufFile& file, const std::string& name);
// A tensor's bytes as the file holds them (info.nbytes() of them).
std::vector<uint8_t> read_gguf_tensor_bytes(const GgufFile& file, const std::string& name);

}  // namespace moe::io
