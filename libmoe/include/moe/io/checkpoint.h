// Checkpoints: one HDF5 file holding a model's parameters, optimizer state, configs, training
// position, sharding and provenance. docs/FORMATS.md ("Checkpoint, version 1") is the contract.
//
// Shape letters: E experts of a layer; an expert tensor's leading dimension is E (w1 [E,F,D],
// w2 [E,D,F], biases [E,F] / [E,D]), and each expert's slice is its own HDF5 chunk, so
// read_expert() reads and checksums only that expert's bytes.
//
// Writes are atomic: the file is written as `path.tmp-<pid>`, closed, fsync'ed, renamed over
// `path`, and the directory fsync'ed; a failure removes the temporary file and leaves an existing
// `path` untouched. Loads are bitwise: every tensor comes back with the bytes it was saved with.
// All functions throw moe::Error naming the file and the cause. Tensors read from a file must
// outlive any step, so these functions refuse to run inside an ArenaScope.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "moe/param.h"
#include "moe/tensor.h"

namespace moe::io {

struct Provenance {
  std::string tool, version, git, argv, time;  // argv: shell-quoted, joined by spaces;
};                                             // time: ISO 8601 UTC ("2024-05-01T12:34:56Z")

// An expert tensor [E, ...rest] that is never held whole, produced one expert at a time (the
// experts of an offloaded run, which live in a store; or an expert dataset of a checkpoint being
// loaded with streaming). read(e) returns expert e's slice, shaped [...rest] or [1, ...rest], of
// `dtype`, on any device; whatever it throws fails the save (or load) that asked.
struct ExpertSource {
  Shape shape;  // the whole tensor's
  DType dtype = DType::f32;
  std::function<Tensor(int64_t expert)> read;
};

// A tensor that is read (or computed) only when it is needed, whole: a non-expert tensor of a
// checkpoint opened lazily, or a conversion's output computed from such a tensor. read() returns
// a host tensor of `shape` and `dtype`; whatever it throws fails the save (or load) that asked.
// Conversions chain these so that a model passes through them one tensor at a time.
struct TensorSource {
  Shape shape;
  DType dtype = DType::f32;
  std::function<Tensor()> read;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;
  bool expert = false;  // leading dim indexes experts -> one HDF5 chunk per expert
  ParamShard shard{};   // defined: this tensor is that slice of a larger one (sharded checkpoints)
  // Set (and `tensor` undefined): a streamed expert tensor (`expert` is true). save_checkpoint
  // writes it expert by expert into the very dataset the whole tensor would give.
  std::shared_ptr<const ExpertSource> source{};
  // Set (and `tensor` undefined, `source` null): a deferred tensor, read whole when written.
  std::shared_ptr<const TensorSource> deferred{};
  // A deferred tensor whose read maps it from the file (map_checkpoint): a read-only mapping, never
  // written through (a write faults), its bytes checked only as MapOptions says.
  bool mapped = false;

  bool streamed() const { return source != nullptr; }
  bool is_deferred() const { return deferred != nullptr; }
  // Whether the values are held here (neither streamed nor deferred).
  bool held() const { return !source && !deferred; }
  const Shape& shape() const {
    return source ? source->shape : deferred ? deferred->shape : tensor.shape();
  }
  DType dtype() const { return source ? source->dtype : deferred ? deferred->dtype : tensor.dtype(); }
  // Expert e's slice [...rest], from the source or the whole tensor (a view of it then; a deferred
  // tensor is read whole for it).
  Tensor expert_slice(int64_t e) const;
  // The whole tensor: `tensor`, the deferred tensor read, or the source's slices gathered.
  Tensor whole() const;
};

// A per-tensor transform that keeps lazy tensors lazy (the seam of every streaming conversion):
// f(x, expert) maps a tensor (expert -1) or expert e's slice of an expert tensor to the output's
// whole tensor or slice e. A held input is transformed now; a deferred one when the output is
// read; a streamed expert tensor one expert at a time. `shape` and `dtype` are the whole output's.
using TensorFn = std::function<Tensor(const Tensor& x, int64_t expert)>;
NamedTensor map_tensor(const NamedTensor& in, const Shape& shape, DType dtype, TensorFn f);
// Reads every streamed or deferred tensor into memory (each is held() afterwards), running what
// its sources check: for small models and tests. A large model is written lazily instead.
void hold_all(std::vector<NamedTensor>& tensors);

struct TrainState {
  int64_t step = 0, tokens_seen = 0;
  int64_t data_cursor = 0;  // position of the data sampler (windows consumed)
  uint64_t seed = 0;        // RNG is counter-based: (seed, step, ...) is the whole RNG state
};

struct Sharding {
  int world_size = 1, ep_size = 1;
  std::vector<int> expert_rank;  // empty = all on rank 0
  // Sharded checkpoints (a directory of per-rank files, docs/FORMATS.md): the rank that wrote
  // this file (-1: an unsharded file holding everything), and whether the token embedding is
  // split by columns over the world.
  int rank = -1;
  bool shard_embedding = false;
};

// A tokenizer travelling with the model (import-hf keeps the source directory's): its file name
// (tokenizer.json or tokenizer.model, moe/io/tokenizer.h) and bytes, verbatim. Empty: none (a
// byte-level model needs none).
struct StoredTokenizer {
  std::string file, bytes;
  bool empty() const { return file.empty(); }
};

struct Checkpoint {
  nlohmann::json model_config, train_config;  // stored as JSON string attributes
  Provenance provenance;
  std::vector<NamedTensor> params;  // dtype as stored (f32, bf16, f16); "blocks.3.moe.experts.w1"
  std::vector<NamedTensor> optim;   // fp32 optimizer state, any names; stored under /optim
  TrainState state;
  Sharding sharding;
  StoredTokenizer tokenizer;  // /tokenizer/<file>
};

// hold_all of params and optim.
void hold_all(Checkpoint& ckpt);

inline constexpr int kCheckpointVersion = 1;
inline constexpr const char* kCheckpointFormat = "moe.checkpoint";

struct SaveOptions {
  // Chunks above this are cut into row chunks (HDF5 cannot hold a chunk of 4 GiB or more).
  size_t max_chunk_bytes = size_t(1) << 30;
};

// Atomic save (see above). Tensor names must be non-empty, unique within params (and within
// optim), and contain no '/'; an empty provenance.time is filled with the current UTC time.
// Streamed tensors (NamedTensor::source) are written one expert at a time into the dataset the
// whole tensor would give; whatever a source throws fails the save like an I/O error.
void save_checkpoint(const std::string& path, const Checkpoint& ckpt,
                     const SaveOptions& options = {});

// Validates format, version, and every dataset's shape/dtype metadata, then reads everything
// (the optimizer state only when `with_optim`). Tensors keep the order they were saved in.
Checkpoint load_checkpoint(const std::string& path, bool with_optim = true);
// The same, except that the expert tensors for which stream(optim, name) is true (`optim`: the
// tensor is under /optim) come back streamed: their metadata is validated, and each read(e) of
// their source reads and checksums expert e's chunk only (the file stays open while a source
// does). Resuming an offloaded run fills its store this way, never holding a whole tensor.
using StreamFilter = std::function<bool(bool optim, const std::string& name)>;
Checkpoint load_checkpoint(const std::string& path, bool with_optim, const StreamFilter& stream);
// The same with nothing read yet: every expert tensor comes back streamed and every other tensor
// deferred (NamedTensor::deferred), the file staying open while any of them does; metadata,
// configs, state and tokenizer are read and validated now. What a conversion reads through it is
// one tensor (or one expert) at a time, so a model of any size converts in bounded memory.
Checkpoint open_checkpoint_lazy(const std::string& path, bool with_optim = true);
// How map_checkpoint treats the file's parameters.
struct MapOptions {
  // Check every mapped chunk's Fletcher32 when it is mapped (reading it through the page cache);
  // otherwise mapped bytes are not checked when opening (docs/FORMATS.md "Mapped weights").
  bool verify = false;
};
// load_checkpoint(path, false, stream), except that each parameter stored as a mapping needs
// (docs/FORMATS.md "Mapped weights": a whole tensor in one chunk 64-byte aligned, or an expert
// tensor whose experts' chunks are whole pages at page offsets) comes back as a read-only mapping
// of the file: a deferred tensor flagged NamedTensor::mapped, whose whole() maps it (checking its
// chunks' checksums first with `verify`), so a loader holds one mapping more at a time than it
// has released. Opening costs no reading, the page cache is shared between processes and only the
// pages touched become resident. The others are read or streamed as load_checkpoint does. A chunk
// past the end of the file is refused now (moe::Error naming the file and tensor), not met as a
// fault mid-run. Writing a mapped tensor is a crash (SIGSEGV).
Checkpoint map_checkpoint(const std::string& path, const StreamFilter& stream,
                          const MapOptions& options = {});
// The same from the bytes of a checkpoint file held in memory (an HDF5 file image, nothing on
// disk); `name` stands for the file in messages.
Checkpoint load_checkpoint_image(const std::string& bytes, const std::string& name,
                                 bool with_optim = true);
// Whether a stored tensor of another floating dtype loads into `p`, converted: only a frozen
// parameter (the routers' selection bias, kept in f32 in every model; a file from moe-convert
// dtype, or written before it was, holds it in the model's dtype).
bool converts_on_load(const Param& p, DType stored);
// What every loader checks of a checkpoint's parameters against the model it builds (moe-train
// --resume, moe-convert inspect --verify): each tensor is a parameter of `params` with its exact
// shape and dtype (but converts_on_load), and no parameter is missing. Throws moe::Error naming
// `source` and the tensor.
void check_params_match(const ParamSet& params, const std::vector<NamedTensor>& tensors,
                        const std::string& source);

nlohmann::json read_model_config(const std::string& path);
// The tokenizer stored in a checkpoint file (empty when it holds none); nothing else is read.
StoredTokenizer read_tokenizer(const std::string& path);
// One tensor of /params.
Tensor read_param(const std::string& path, const std::string& name);
// One expert's slice [...rest] of an expert tensor of /params, reading only that chunk.
Tensor read_expert(const std::string& path, const std::string& name, int64_t expert);
// Names under /params, in saved order.
std::vector<std::string> list_params(const std::string& path);
// The same for /optim (e.g. one expert's Adam moments for expert-wise CPU Adam).
std::vector<std::string> list_optim(const std::string& path);
Tensor read_optim(const std::string& path, const std::string& name);
Tensor read_optim_expert(const std::string& path, const std::string& name, int64_t expert);

// Provenance helpers for tools.
std::string shell_quote(std::string_view arg);             // POSIX sh quoting, only when needed
std::string join_argv(int argc, const char* const* argv);  // shell-quoted, space-separated
std::string utc_timestamp();                               // now, "YYYY-MM-DDTHH:MM:SSZ"
// tool, this library's version and git revision, the command line, now.
Provenance make_provenance(std::string tool, int argc, const char* const* argv);

}  // namespace moe::io
