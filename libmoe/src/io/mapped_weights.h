// Tensors mapped read-only from a checkpoint file instead of read (docs/FORMATS.md "Mapped
// weights"): a tensor whose chunks lie in the file as their raw bytes (Fletcher32 is the only
// filter: each chunk is the bytes, then a 4-byte checksum) becomes a view of the page cache.
// Shape letters: E experts (the leading dimension of an expert tensor, one chunk per expert).
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moe/io/hdf5.h"
#include "moe/tensor.h"

namespace moe::io {

// A checkpoint file opened for mapping: its descriptor and its size when opened.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // moe::Error naming the file when it cannot open
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  int64_t size() const { return size_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// HDF5's Fletcher32 of `bytes` (the checksum its filter appends to a chunk), fed in pieces: each
// piece but the last must be a whole number of kFletcherPiece bytes.
class Fletcher32 {
 public:
  static constexpr size_t kFletcherPiece = 720;  // 360 16-bit words between folds
  void add(const unsigned char* bytes, size_t n);
  uint32_t value() const;

 private:
  uint32_t sum1_ = 0, sum2_ = 0;
};

// Where a mappable dataset's chunks lie (by leading index: one for a whole tensor, E for an expert
// tensor), found when the file is opened; the mapping itself is made later (map_planned).
struct MappingPlan {
  struct Chunk {
    uint64_t addr = 0, size = 0;  // file offset and stored bytes (raw + 4-byte checksum)
  };
  std::vector<Chunk> chunks;
  Shape shape;
  DType dtype = DType::f32;
  bool expert = false;
  std::string object;  // "/params/NAME", for messages
};

// The plan of dataset `dataset` (`info` its validated metadata), or nothing when its storage does
// not suit a mapping (more filters than Fletcher32, chunks other than the whole tensor or one per
// expert, a whole tensor not 64-byte aligned in the file, an expert not page-aligned or not a
// whole number of pages): the caller reads it then. Throws a moe::Error naming the file and
// tensor when a chunk lies past the end of the file (truncated: the mapping would fault mid-run).
std::optional<MappingPlan> plan_mapping(const MappedFile& file, hid_t dataset,
                                        const h5::DatasetInfo& info, const h5::Where& where);

// The planned tensor as a read-only mapping of `file`; undefined when mmap refuses (a limit on
// address space, say: read it then). With `verify`, each chunk's Fletcher32 is checked first, read
// through the page cache in pieces (the mapping itself is left untouched).
Tensor map_planned(const MappedFile& file, const MappingPlan& plan, bool verify);

}  // namespace moe::io
