// safetensors files (Hugging Face's tensor container), read and written by our own code.
//
// The format: an 8-byte little-endian unsigned header length N, then N bytes of UTF-8 JSON, then
// the data section. The JSON is one object mapping each tensor name to
//   {"dtype": "F32" | "BF16" | "F16" | ..., "shape": [d0, d1, ...], "data_offsets": [begin, end]}
// with offsets in bytes relative to the start of the data section (right after the header), plus
// an optional "__metadata__" object of string -> string. Tensors are row-major, little-endian.
//
// What the reader checks (each failure is a moe::Error "'<path>': safetensors: <cause>"):
//   the file holds at least the 8-byte length; N <= 100 MB (kSafetensorsMaxHeader); 8 + N fits in
//   the file; the header is valid JSON, an object, without duplicate names; "__metadata__" is an
//   object of strings; every entry has a known dtype (an unknown one is named), a shape of
//   non-negative integers and two offsets begin <= end; end - begin == prod(shape) * dtype size;
//   and the entries tile the data section exactly: sorted by offset they start at 0, each begins
//   where the previous one ends (no hole, no overlap) and the last one ends at the end of the
//   file (offsets beyond the file mean a truncated file; bytes after the last tensor are a hole).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"
#include "moe/tensor.h"

namespace moe::io {

// The format's header limit (the reference implementation's): 100,000,000 bytes.
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

// Element size in bytes of a safetensors dtype name ("F32" -> 4), 0 when the name is unknown.
// Known: BOOL U8 I8 F8_E4M3 F8_E5M2 F8_E8M0 (1), U16 I16 F16 BF16 (2), U32 I32 F32 (4),
// U64 I64 F64 (8).
size_t safetensors_dtype_size(const std::string& name);
// Our dtype <-> safetensors names: f32 F32, bf16 BF16, f16 F16, i32 I32, i64 I64, u8 U8.
const char* safetensors_dtype_name(DType dtype);
// Whether a safetensors dtype has a moe::DType (and which, through `out`).
bool dtype_from_safetensors(const std::string& name, DType* out);

struct SafetensorsEntry {
  std::string name;
  std::string dtype;            // the file's name for it: "F32", "BF16", ...
  Shape shape;                  // [] is a scalar (one element)
  uint64_t begin = 0, end = 0;  // byte offsets relative to the data section
};

// An open, fully validated safetensors file. The header is read and checked on construction;
// tensors are read one at a time on demand. Movable, not copyable.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;

  const std::string& path() const { return path_; }
  // Every tensor, in data order (increasing offsets: the order the writer was given).
  const std::vector<SafetensorsEntry>& tensors() const { return entries_; }
  // The entry of `name`, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor's bytes as a moe::Tensor, bitwise: F32, BF16, F16, I32, I64, U8 map to our dtypes.
  // Other dtypes (F64, I8, F8_*, ...) are refused naming the dtype; an unknown name is an error.
  Tensor read(const std::string& name) const;
  // Rows [begin, end) of the tensor's leading dimension ([end - begin, ...rest]), reading only
  // their bytes: one expert of a fused expert tensor.
  Tensor read_rows(const std::string& name, int64_t begin, int64_t end) const;
  // Elements [first, first + numel(shape)) of the tensor in row-major order, as a tensor of
  // `shape`, reading only their bytes: the gate or the up half of a fused expert.
  Tensor read_elements(const std::string& name, int64_t first, const Shape& shape) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;  // 8 + N
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (CPU tensors of our dtypes, names unique, non-empty and not "__metadata__";
// whole tensors, not shards) in the given order, with `metadata` as "__metadata__" (omitted when
// empty). The header is padded with spaces so the data section starts at a multiple of 8.
// Atomic: written to `path.tmp-<pid>`, fsync'ed, renamed over `path`, the directory fsync'ed; on
// failure the temporary file is removed and an existing `path` is left as it was.
// A deferred or streamed NamedTensor (moe/io/checkpoint.h) is read when its bytes are written, one
// tensor (or one expert of a streamed one) at a time; what its source throws removes the
// temporary file and is thrown as it is. Only the name and the values of each are used.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace moe::io
