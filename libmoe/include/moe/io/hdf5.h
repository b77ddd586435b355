// HDF5 (1.10 C API) for libmoe: RAII handles, checked calls, attributes and tensor datasets.
//
// Every HDF5 call goes through MOE_H5(where, call): a negative return becomes a moe::Error naming
// the file and the object (`where`), what the call was doing in words ("listing the group") and
// why it failed (the errno our driver saw, "the file is damaged: checksum mismatch", or HDF5's
// innermost cause), with the source line; the statement and HDF5's whole error stack go to the
// debug log (-v) only (io/hdf5_errors.h). HDF5's automatic error-stack printing is switched off
// by h5::Session, which every public io entry point holds: it also serialises HDF5 use, because
// the Debian serial build of the library is not thread-safe.
//
// Tensor datasets: chunked with the Fletcher32 checksum filter, attribute `dtype` ("f32", "bf16",
// "f16", "i32", "i64", "u8") and, for expert tensors, attribute `expert` = 1 with one chunk per
// expert (chunk [1, ...rest]). bf16 and f16 are HDF5 float types with their exact bit layouts, so
// the stored bytes are the tensor's bytes. Byte order is little-endian (the hosts libmoe runs on).
#pragma once
#include <hdf5.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moe/dtype.h"
#include "moe/error.h"
#include "moe/param.h"
#include "moe/tensor.h"

namespace moe::io::h5 {

// The file and the object a call concerns, for messages: "'ckpt.h5' /params/w1".
struct Where {
  std::string file;
  std::string object = "/";
  Where at(std::string child_object) const { return {file, std::move(child_object)}; }
  std::string describe() const;
};

// Holds the process-wide HDF5 lock (recursive) and turns HDF5's automatic error printing off.
class Session {
 public:
  Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

 private:
  std::unique_lock<std::recursive_mutex> lock_;
};

// Descriptions on HDF5's current error stack, outermost first, de-duplicated; clears the stack.
std::vector<std::string> take_error_stack();

// Throws the moe::Error for a failed call (see MOE_H5).
[[noreturn]] void fail(const Where& where, const char* statement, const char* source_file,
                       int source_line);

template <class T>
T checked(T value, const Where& where, const char* statement, const char* source_file,
          int source_line) {
  if (value < 0) fail(where, statement, source_file, source_line);
  return value;
}

// An owned HDF5 identifier, closed by `Close` when it goes out of scope (errors ignored there:
// destructors cannot throw; call close() where a failure to close must be reported, e.g. files).
template <herr_t (*Close)(hid_t)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, kInvalid)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, kInvalid);
    }
    return *this;
  }
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: handles are passed straight to the C API
  bool valid() const { return id_ >= 0; }
  void reset() noexcept {
    if (id_ >= 0) Close(id_);
    id_ = kInvalid;
  }
  void close(const Where& where) {
    hid_t id = std::exchange(id_, kInvalid);
    if (id >= 0) checked(Close(id), where, "H5*close(handle)", __FILE__, __LINE__);
  }
  hid_t release() noexcept { return std::exchange(id_, kInvalid); }

 private:
  static constexpr hid_t kInvalid = -1;
  hid_t id_ = kInvalid;
};

using File = Handle<H5Fclose>;
using Group = Handle<H5Gclose>;
using Dataset = Handle<H5Dclose>;
using Space = Handle<H5Sclose>;
using Type = Handle<H5Tclose>;
using Attr = Handle<H5Aclose>;
using Plist = Handle<H5Pclose>;

// ---- files ------------------------------------------------------------------------------------

// File access properties used for every moe file: the HDF5 1.10 object formats, whose metadata
// (superblock, object headers, B-trees, chunk indexes) all carry checksums, so damage is refused
// before libhdf5 trusts it (docs/FORMATS.md); file locking that is skipped where the file system
// does not support it.
Plist file_access_plist(const Where& where);
// Attributes (and, for groups, links) of objects created with this plist stay in the object
// header up to kMaxCompact of them instead of moving to a fractal heap past 8: libhdf5 1.10
// crashes on a damaged dense link table (docs/FORMATS.md, "HDF5 object formats").
inline constexpr unsigned kMaxCompact = 65535;
void keep_compact(hid_t object_create_plist, bool links, const Where& where);
// File creation properties of every moe file (compact root group).
Plist file_create_plist(const Where& where);

// What libmoe's HDF5 driver (io/hdf5_driver.h) saw of a file being written.
struct WriteStatus {
  int error = 0;         // errno of the first failed write or truncate; 0 = none
  std::string what;      // "write of N bytes at offset X of 'path'"
  bool closing = false;  // set by WriteFile::close: failures are recorded, not returned to HDF5
};

// A file being written, through libmoe's driver. close() flushes and closes it and throws the
// first write failure with its cause (e.g. "No space left on device"). Destroying a WriteFile
// that was not closed (error paths) closes it discarding whatever is still unwritten: HDF5 1.10
// crashes at exit when a file's last flush fails, so a failed file must still close cleanly.
// (Objects of the file still open then keep it open, discarding, until they close.)
class WriteFile {
 public:
  WriteFile() = default;
  WriteFile(File file, std::shared_ptr<WriteStatus> status)
      : status_(std::move(status)), file_(std::move(file)) {}
  WriteFile(WriteFile&& other) noexcept = default;
  WriteFile& operator=(WriteFile&& other) noexcept {
    if (this != &other) {
      abandon();
      status_ = std::move(other.status_);
      file_ = std::move(other.file_);
    }
    return *this;
  }
  ~WriteFile() { abandon(); }

  hid_t get() const { return file_.get(); }
  operator hid_t() const { return file_.get(); }  // NOLINT: passed straight to the C API
  bool valid() const { return file_.valid(); }
  void close(const Where& where);
  void abandon() noexcept;  // close, discarding unwritten data; the file is to be removed

 private:
  std::shared_ptr<WriteStatus> status_;  // shared with the driver (see io/hdf5_driver.h)
  File file_;
};

// Creates (truncates) `path` with compact root-group storage; `fapl` defaults to
// file_access_plist() (libmoe's driver is set on it).
WriteFile create_file(const std::string& path, hid_t fapl = -1);
// Opens an existing moe file for writing (e.g. to add an attribute).
WriteFile open_file_readwrite(const std::string& path);
// Opens read-only after checking the path: missing file, empty file, not HDF5, truncated -> Error.
File open_file_readonly(const std::string& path, const char* what = "file");
// Opens `bytes` read-only as an in-memory HDF5 file (core driver, file image; HDF5 copies the
// bytes), with the same checks and messages as open_file_readonly; `name` stands for the file in
// messages ("-" for stdin).
File open_image(const std::string& bytes, const std::string& name, const char* what = "file");
// Before reading a dataset of a file of an earlier build (superblock older than version 3): the
// storage its chunk index claims fits in the file. A damaged record of those unchecksummed v1
// B-trees otherwise makes libhdf5 allocate whatever size it holds (2.5 GB seen) before noticing.
void check_storage_fits(hid_t dataset, const Where& where);

// Creates a group whose links remember their creation order (iteration then follows it).
Group create_group(hid_t parent, const std::string& name, const Where& where);
Group open_group(hid_t parent, const std::string& name, const Where& where);
bool has_link(hid_t parent, const std::string& name, const Where& where);
// Names of the links in a group, in creation order when the group tracks it, else by name.
std::vector<std::string> list_links(hid_t group, const Where& where);

// ---- attributes (scalars unless noted; strings are written fixed-length UTF-8) ----------------

bool has_attr(hid_t object, const char* name, const Where& where);
void write_string_attr(hid_t object, const char* name, const std::string& value,
                       const Where& where);
std::string read_string_attr(hid_t object, const char* name, const Where& where);  // fixed or vlen
void write_int_attr(hid_t object, const char* name, int64_t value, const Where& where,
                    hid_t file_type = H5T_STD_I64LE);
int64_t read_int_attr(hid_t object, const char* name, const Where& where);  // any integer type
void write_uint_attr(hid_t object, const char* name, uint64_t value, const Where& where);  // U64LE
uint64_t read_uint_attr(hid_t object, const char* name, const Where& where);
// One-dimensional integer array (may be empty), stored as I32LE.
void write_int32_array_attr(hid_t object, const char* name, const std::vector<int>& values,
                            const Where& where);
std::vector<int> read_int32_array_attr(hid_t object, const char* name, const Where& where);

// ---- types and tensor datasets ----------------------------------------------------------------

// The HDF5 type of a dtype's stored bytes (also used as the memory type: no conversion happens).
// f32: IEEE F32LE; f16: IEEE binary16 (sign 15, exponent 10..14 bias 15, mantissa 0..9);
// bf16: sign 15, exponent 7..14 bias 127, mantissa 0..6; i32/i64: STD I32LE/I64LE; u8: STD U8LE.
Type dtype_type(DType dtype);
// The dtype whose type equals `type` exactly, if any.
std::optional<DType> dtype_from_type(hid_t type);

// HDF5 refuses chunks of 4 GiB or more; we stay well below so filter buffers stay reasonable.
inline constexpr size_t kMaxChunkBytes = size_t(1) << 30;
// Files we write start every allocation of this many bytes or more (a tensor's chunk, an
// expert's) on a multiple of it: a page, so that such a chunk can be mapped where it lies
// (docs/FORMATS.md "Mapped weights"). Chunks written one after another are then separated by at
// most this much less one byte of padding.
inline constexpr hsize_t kDataAlignment = 4096;

// Chunk shape for a dataset of `shape`: one chunk per expert ([1, ...rest]) when `expert`, else
// the whole tensor; a chunk larger than `max_bytes` is cut along its leading dimensions (rows).
// Empty for shapes that cannot be chunked (rank 0 or zero elements).
std::vector<hsize_t> chunk_shape(const Shape& shape, size_t element_size, bool expert,
                                 size_t max_bytes = kMaxChunkBytes);

// Writes `tensor` as dataset `name` of `parent`: chunked per chunk_shape, Fletcher32 checksummed,
// attributes `dtype` and `expert` (0/1). Rank-0 and zero-element tensors cannot be chunked and are
// stored contiguous, without the filter.
// A defined `shard` (the tensor is a slice of a larger one, see moe::ParamShard) adds the
// attributes `shard_shape` (int64 array: the whole tensor's shape), `shard_dim` and `shard_start`.
void write_tensor(hid_t parent, const std::string& name, const Tensor& tensor, bool expert,
                  const Where& where, size_t max_chunk_bytes = kMaxChunkBytes,
                  const ParamShard* shard = nullptr);

// The same dataset write_tensor writes for an expert tensor of `shape` (E = shape[0]) and
// `dtype` (same chunks, filter, attributes and bytes), its data written one expert at a time:
// expert(e) returns expert e's slice, [...rest] or [1, ...rest], on any device, and only that
// slice is held while its chunk is written (a hyperslab write). A slice of the wrong shape or
// dtype, or whatever expert(e) throws, fails the write.
void write_expert_rows(hid_t parent, const std::string& name, const Shape& shape, DType dtype,
                       const std::function<Tensor(int64_t expert)>& expert, const Where& where,
                       size_t max_chunk_bytes = kMaxChunkBytes, const ParamShard* shard = nullptr);

struct DatasetInfo {
  Shape shape;
  DType dtype = DType::f32;
  bool expert = false;
  ParamShard shard;  // defined when the dataset carries the shard attributes (validated)
};
// Validated metadata of a tensor dataset: the `dtype` attribute (when present) names a known
// dtype and agrees with the HDF5 type; without it the type must be one of ours; expert datasets
// have rank >= 1.
DatasetInfo dataset_info(hid_t dataset, const Where& where);
// Reads a whole tensor dataset; the tensor is named `name`.
Tensor read_tensor(hid_t parent, const std::string& name, const Where& where,
                   DatasetInfo* info = nullptr);
// Reads `[index, ...]` of the leading dimension only (a hyperslab: for expert datasets exactly one
// chunk is read and checksummed).
Tensor read_tensor_row(hid_t parent, const std::string& name, int64_t index, const Where& where);

}  // namespace moe::io::h5

// MOE_H5(where, H5Xcall(...)): the call's value, or a moe::Error naming where, what, why, line.
#define MOE_H5(where, call) ::moe::io::h5::checked((call), (where), #call, __FILE__, __LINE__)
