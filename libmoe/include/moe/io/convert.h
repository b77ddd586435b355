// Checkpoint conversions (moe-convert): describe a checkpoint, change its parameter dtype, freeze
// it for inference, merge a sharded checkpoint into one file, partition one file into the
// trainer's sharded layout for N expert-parallel ranks (contiguous, or placed by profiled load
// with Graham's LPT rule). docs/FORMATS.md ("Checkpoint, version 1", "Sharded checkpoints",
// "Converted checkpoints") is the contract for what these functions read and write.
//
// Shape letters: E experts of a MoE layer, L MoE layers, N ranks, V vocabulary, D model width.
//
// Guarantees every function here keeps:
// - No tensor is lost silently: every tensor of the input is in the output, or the function
//   throws (a dropped group is dropped whole and on purpose: freeze drops /optim).
// - Byte-exact where nothing is converted: merge(partition(x)) holds x's parameter and optimizer
//   bytes exactly, in x's order.
// - Inputs are checked before anything is written; messages name the file, the tensor and the
//   cause (moe::Error; moe::UsageError for requests that cannot make sense, e.g. N not dividing
//   a layer's E).
// Memory: dtype, freeze and quantize keep the inputs' laziness (moe/io/checkpoint.h,
// open_checkpoint_lazy and map_tensor), so converting a lazily opened checkpoint holds one tensor
// (one expert of an expert tensor) at a time; so do merge (open_merged) and partition of a lazily
// opened checkpoint. open_whole() opens what these read: lazily, a sharded checkpoint merged.
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/balance/placement.h"
#include "moe/io/checkpoint.h"
#include "moe/io/checkpoint_dir.h"
#include "moe/io/trace.h"
#include "moe/models/config.h"

namespace moe::io {

// ---- merge ------------------------------------------------------------------------------------

// One unsharded checkpoint from the files of a sharded one (each loaded with load_checkpoint).
// Checks, before assembling anything: every file is a shard (has /sharding rank); ranks are
// distinct; every rank that must hold tensors is present (rank 0; ranks 0..ep_size-1 with
// ep_size > 1; every rank with shard_embedding); the files agree on step, tokens, data cursor,
// seed, model and training configuration, world size, ep size, shard_embedding and expert_rank;
// every tensor is either whole in exactly one file, or sliced in files whose slices share dtype,
// expert flag, shard_shape and shard_dim and tile that dimension exactly (no gap, no overlap).
// Slices are concatenated along shard_dim in shard_start order; with a non-contiguous expert_rank
// (a placed partition) the experts are put back in expert order. Tensors keep the order of rank
// 0's file (names found only in other files follow their predecessor there).
// The result is an unsharded layout: /sharding world_size 1, ep_size 1, no expert_rank, no rank;
// the training configuration's `ep` becomes 1 and `shard_embedding` false, so one process can
// resume it. Provenance is rank 0's.
Checkpoint merge_shards(const std::vector<std::string>& files);
// The same with each file opened lazily (open_checkpoint_lazy): every check above is made now, on
// the files' metadata, and nothing is read until a tensor of the result is (when it is written):
// an expert tensor one expert at a time, from the file holding it; any other tensor whole, its
// slices read one after another into it. A checkpoint of any size merges in bounded memory.
Checkpoint open_merged(const std::vector<std::string>& files);
// Elements [start, start + count) of dimension `dim` of a host tensor (a ParamShard's slice of a
// whole tensor), as a new tensor.
Tensor slice_dim(const Tensor& t, int dim, int64_t start, int64_t count);
// The same for checkpoints already in memory (or opened lazily: their slices are then joined only
// when read); names[i] names shards[i] in messages.
Checkpoint merge_shards(std::vector<Checkpoint> shards, const std::vector<std::string>& names);

// A whole checkpoint from `paths` (see checkpoint_files): one unsharded file as it is, the files of
// a sharded checkpoint merged. `merged` (optional) says which happened.
Checkpoint load_whole(const std::vector<std::string>& paths, bool with_optim = true,
                      bool* merged = nullptr);
// The same, but opened lazily: one unsharded file with open_checkpoint_lazy, the files of a
// sharded one with open_merged; nothing is read until a tensor is.
Checkpoint open_whole(const std::vector<std::string>& paths, bool with_optim = true,
                      bool* merged = nullptr);

// ---- partition and expert placement -----------------------------------------------------------

// The placements themselves (contiguous, round robin, LPT) are in moe/balance/placement.h.

struct LayerPlacement {
  int64_t layer = 0, block = 0, experts = 0;
  std::vector<int64_t> loads;                     // [E] assignments per expert over the trace
  std::vector<int> lpt, contiguous, round_robin;  // [E] expert -> rank
  double lpt_max_over_mean = 0, contiguous_max_over_mean = 0, round_robin_max_over_mean = 0;
};
// Per MoE layer of `model`, the three placements over N ranks and their predicted balance from the
// trace's expert loads (every choice of every token). The trace must come from a model of the
// same MoE layers (blocks), experts per layer and top-k, else Error naming both.
std::vector<LayerPlacement> plan_placement(const ModelConfig& model, const TraceReader& trace,
                                           int ranks);

struct PartitionOptions {
  int ranks = 2;                 // N: world size and expert-parallel size of the output
  bool shard_embedding = false;  // also split embed.tokens by columns over the N ranks (untied
                                 // head only, like moe-train --shard-embedding)
  // Per MoE layer (in block order), expert -> rank; empty: contiguous (the trainer's layout).
  std::vector<std::vector<int>> placement;
};
// The N files of a sharded checkpoint in the trainer's layout (docs/FORMATS.md): replicated
// tensors whole in rank 0's file; each expert tensor (and its optimizer tensors) cut along experts,
// rank p holding the [E/N, ...] slice of its experts (contiguous: [p E/N, (p+1) E/N)); with
// shard_embedding, embed.tokens and its optimizer tensors cut along D. With a non-contiguous
// placement, rank p's slice holds the experts placed on it in ascending id order, at shard_start
// p E/N of the rank-major order, and /sharding expert_rank records the placement (the concatenated
// per-layer maps); moe-train cannot resume that layout (see FORMATS.md). The training
// configuration's `ep` becomes N (and `shard_embedding` the option), so `mpiexec -n N moe-train
// --resume DIR` picks the layout up. Optimizer tensors are matched to their parameter by name
// suffix ("adam.m.<param>"); one that matches none is kept whole in rank 0's file.
// Held tensors are cut now. Tensors of a lazily opened `whole` (open_whole) stay lazy: each rank's
// slice is read when its file is written, an expert tensor one expert at a time (any other tensor
// read whole and cut), so the files are written in bounded memory.
std::vector<Checkpoint> partition(const Checkpoint& whole, const PartitionOptions& options);

// Writes the files of a sharded checkpoint (files[r] as rank-<5 digits>.h5, r = its
// sharding.rank) into `dir`: first into the sibling directory `dir.tmp-<pid>` (every file atomic,
// fsync'ed), then renamed to `dir`. An existing `dir` is refused unless `replace`; then it is
// renamed aside, the new one moved in, and the old one removed (a crash in between leaves
// `dir.old-<pid>` and `dir.tmp-<pid>`, never a mix of old and new files in `dir`).
// `history` (may be null) is stored in every file as in save_converted.
void save_sharded(const std::string& dir, const std::vector<Checkpoint>& files, bool replace,
                  const nlohmann::json& history = nullptr);

// ---- dtype and freeze -------------------------------------------------------------------------

struct DTypeReport {
  int64_t tensors_converted = 0;
  int64_t masters_added = 0;      // fp32 master copies created (f32 -> 16-bit with optimizer state)
  int64_t masters_used = 0;       // 16-bit parameters rebuilt from their exact fp32 masters
  int64_t masters_dropped = 0;    // -> f32: masters become the parameters
  double max_relative_error = 0;  // max |new - old| / max|old| over the converted tensors
};
// Parameters to `to` (f32, bf16 or f16; round to nearest even), model_config.dtype updated.
// Optimizer state stays fp32 and loses nothing: to 16-bit, each f32 parameter's exact values are
// kept as its `master.<param>`, and an existing master is the source of the rounding; to f32, a
// parameter becomes its master (exact), the master is dropped. Values beyond f16's range are an
// Error naming the tensor (never silently infinite). Non-floating tensors are not touched.
// Streams: a streamed or deferred input tensor (open_checkpoint_lazy) gives an output tensor that
// is converted when it is written, one tensor (or expert) at a time; its counts are in `report`
// now, its max_relative_error only once the output is written (`report` must outlive that), and
// a value beyond the range fails the save that reads it.
Checkpoint change_dtype(const Checkpoint& in, DType to, DTypeReport* report = nullptr);

// An inference checkpoint: parameters only (/optim dropped), training-only state dropped
// (data_cursor 0; step and tokens_seen kept as information), train_config null, unsharded
// sharding. Each block's expert tensors are listed next to each other (the order is otherwise
// kept). Parameter bytes are unchanged. Write it with save_streaming for the streaming layout.
Checkpoint freeze(const Checkpoint& in);

// ---- quantisation (moe-convert quantize) -------------------------------------------------------

// The model_config key a quantised checkpoint carries ("quantization": the recipe), and the
// weights it quantises: weight matrices (".weight", ".w1", ".w2", ".w3"; 2-D or more; not biases)
// other than the embeddings ("embed.*") and the routers (router math stays f32), the same weights
// infer::lean_for_inference keeps in 16 bits.
inline constexpr const char* kQuantizationKey = "quantization";
// Block recipes also list each block-quantised tensor's format: "tensor_formats": {name: format}.
inline constexpr const char* kTensorFormatsKey = "tensor_formats";
bool quantizable(const std::string& name, const Shape& shape);
// The recipe of a GGUF file's own mix of block formats (import-gguf), which quantize cannot make:
// any mix but q4_k_m's, e.g. llama.cpp's Q4_K_M of an 8-expert model (q4_k, q6_k and q8_0).
inline constexpr const char* kMixedRecipe = "mixed";
// The recipe of a quantised checkpoint's model_config ("q8_0", "q4_k", "q6_k", "mxfp4",
// "q4_k_m", "mixed"), "" for one that is not quantised; Error for an unknown recipe or, for a
// block recipe, a missing or malformed tensor_formats.
std::string quantization_of(const nlohmann::json& model_config);
// The block format ("q4_k", "q6_k", "mxfp4" or "q8_0") tensor `name` is stored in, "" when it is
// not block-quantised (any tensor of a q8_0 or unquantised checkpoint, and the tensors a block
// recipe keeps in their dtype). Such a tensor [.., out, in] is a u8 dataset [.., out, row bytes],
// each row the format's blocks back to back, exactly GGUF's bytes (backend/cpu/quant_blocks.h;
// a "q8_0" tensor of a block recipe holds GGUF's q8_0 blocks, f16 d then 32 int8, not the row
// layout of the whole-checkpoint "q8_0" recipe).
std::string block_format_of(const nlohmann::json& model_config, const std::string& name);
// Throws Error naming `source` when model_config is quantised: `who` cannot use it.
void refuse_quantized(const nlohmann::json& model_config, const std::string& source,
                      const std::string& who);

struct QuantReport {
  int64_t tensors_quantized = 0;
  int64_t tensors_kept = 0;                   // quantizable, but `in` is not whole blocks
  int64_t bytes_before = 0, bytes_after = 0;  // of all parameters
  std::map<std::string, int64_t> tensors_per_format;
  double max_error_over_scale = 0;  // q8_0: max |x - dequantised| / block scale (<= 0.5)
  // Block recipes: sqrt(sum (x - dequantised)^2 / sum x^2) over every quantised value.
  double error_sum_squares = 0, value_sum_squares = 0;
  double rms_relative_error() const {
    return value_sum_squares > 0 ? std::sqrt(error_sum_squares / value_sum_squares) : 0;
  }
};
// Quantises every quantizable weight [.., out, in] from its f32 values (the fp32 master when the
// optimizer state has one); the other parameters are kept as they are. The result is an
// inference checkpoint (freeze: no optimizer or training state) with model_config.quantization =
// `type`. Types:
// - "q8_0": u8 [.., out, q8_row_bytes(in)] of our Q8_0 rows (backend/cpu/gemv.h: blocks of 32
//   along `in`, one f16 scale each, int8 values rounded to nearest; any `in`).
// - "q4_k", "q6_k", "mxfp4": llama.cpp's block formats (backend/cpu/quant_blocks.h, its reference
//   quantisers' bytes), for weights whose `in` is a whole number of blocks (256; 32 for mxfp4);
//   the others are kept (tensors_kept), as llama.cpp falls back to another type for them.
// - "q4_k_m": llama.cpp's Q4_K_M mix of those: q6_k for the LM head, and for attention's v and
//   the experts' (or MLP's) w2 in the layers its use_more_bits rule picks (the first and last
//   eighth, and every third in between); q4_k for the rest. (llama.cpp also moves attention k and v
//   of 8-expert models to q8_0; not done here.)
// Refuses a quantised input, a rank's shard, and any other type (UsageError). Streams as
// change_dtype does (the report's error figures are known once the output is written).
Checkpoint quantize(const Checkpoint& in, const std::string& type, QuantReport* report = nullptr);

// ---- provenance of conversions ----------------------------------------------------------------

// {"tool", "version", "git", "argv", "created"} of a provenance.
nlohmann::json to_json(const Provenance& provenance);
// The root attribute `history` of a checkpoint file: a JSON array of the provenance of the files
// it was converted from, oldest first (empty array when absent).
nlohmann::json read_history(const std::string& path);
// history of `source` followed by source's own provenance: the history of a file converted from it.
nlohmann::json extend_history(const nlohmann::json& source_history, const Provenance& source);
// save_checkpoint, plus the root attribute `history` (a JSON string) when `history` is a
// non-empty array; still atomic (the attribute is added to the temporary file before the rename).
void save_converted(const std::string& path, const Checkpoint& ckpt, const nlohmann::json& history);

// Writes a whole checkpoint (no slices) as save_converted does, in the streaming layout that
// `moe-convert freeze` uses: the same datasets, types, attributes and chunking (one Fletcher32
// chunk per expert; any version-1 reader reads it), but each MoE layer's expert data is written
// expert-major (expert 0 of every expert tensor of the block, then expert 1, ...) and the HDF5
// metadata is gathered in blocks apart from the data, so one expert of a layer is one contiguous
// run of bytes and a layer's experts are one extent: a loader reads either with one read.
// Atomic like save_checkpoint.
void save_streaming(const std::string& path, const Checkpoint& ckpt,
                    const nlohmann::json& history = nullptr);

// ---- inspect ----------------------------------------------------------------------------------

struct TensorInfo {
  std::string group;  // "params" or "optim"
  std::string name;
  DType dtype = DType::f32;
  Shape shape;  // of the dataset (a slice's own shape)
  int64_t bytes = 0;
  bool expert = false;
  ParamShard shard;          // defined for a slice of a sharded checkpoint
  int rank = -1;             // the file's rank (-1: unsharded file)
  std::string file;          // the file holding it
  Shape chunk;               // HDF5 chunk shape; empty: contiguous storage
  bool filtered = false;     // Fletcher32 (or any filter) on the chunks
  int64_t file_offset = -1;  // first byte of the tensor's data in the file (-1 when not stored)
  int64_t file_extent = 0;   // bytes from the first to the end of the last chunk
  int64_t stored_bytes = 0;  // bytes of the chunks (data + checksums)
};

struct MoELayerInfo {
  int64_t layer = 0, block = 0, experts = 0;
  int rank = -1;
  std::string file;
  int64_t stored_bytes = 0;         // the layer's expert chunks in this file
  int64_t extent = 0;               // from the first to the end of the last of them
  // "Adjacent" below: the next chunk starts where the last ends, or after at most the alignment
  // padding of files we write (less than h5::kDataAlignment bytes): one sequential read.
  bool one_extent = false;          // the layer's chunks adjacent, one after another
  bool experts_contiguous = false;  // each expert's chunks (of every expert tensor) adjacent
  bool contiguous() const { return one_extent; }  // the layer is one extent
};

struct FileInfo {
  std::string path;
  Provenance provenance;
  nlohmann::json history = nlohmann::json::array();
  TrainState state;
  Sharding sharding;
};

struct CheckpointInfo {
  std::vector<FileInfo> files;  // one, or every rank file of a sharded checkpoint
  nlohmann::json model_config, train_config;
  std::vector<TensorInfo> tensors;      // every dataset of every file, file by file, in saved order
  std::vector<MoELayerInfo> layers;     // storage of each MoE layer's experts, per file
  int64_t params_total = 0;             // elements of the whole parameters (each name once)
  int64_t params_active_per_token = 0;  // experts counted k times per MoE layer (1 residual MoE)
  int64_t param_bytes = 0, optim_bytes = 0;  // of the datasets (all files)
  bool verified = false;                     // every tensor was read and checksummed
  // The stored tokenizer (first file): "tokenizer.json (byte-level BPE, 700 tokens)"; empty: none.
  // One libmoe cannot run reads "<file> (N bytes): <why>" (an error under verify).
  std::string tokenizer;
};
// Metadata only (no tensor data is read) unless `verify`: then every file is also loaded whole,
// so a damaged chunk is an Error naming it. Same inputs as checkpoint_files.
CheckpointInfo inspect(const std::vector<std::string>& paths, bool verify = false);
nlohmann::json to_json(const CheckpointInfo& info);

}  // namespace moe::io
