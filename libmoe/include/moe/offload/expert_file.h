// The SSD tier's files: one file per (layer, expert) under the `--ssd-dir`, each a fixed 4096-byte
// header followed by the expert's record (its payload: weights, fp32 master, Adam moments,
// gradient, as the store lays them out). One write() or read() is one vectored system call over
// header + payload; read_sections() reads only some sections (the weights for a forward pass,
// say). A read verifies the header (format, layer, expert, layout, run, write generation) and
// each section's CRC32C before it returns, so damaged, stale or foreign bytes are refused, never
// handed back. The files are a cache, not a checkpoint: they belong to one ExpertFiles object
// (one run, one process), live in a private run subdirectory, and are removed when the object
// dies. The format is in docs/FORMATS.md ("SSD expert tier (a cache)").
//
// Letters: L layers (indices into the `layers` given), E experts of a layer.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/dtype.h"
#include "moe/tensor.h"

namespace moe::offload {

// One named piece of an expert's record ("w1.value", "w1.adam_m", ...): `bytes` bytes at `offset`
// in the payload, holding a `dtype` tensor of `shape`.
struct RecordSection {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  int64_t offset = 0;
  int64_t bytes = 0;
};

// The byte layout of one expert's record; every expert of a layer shares it, layers may differ.
struct RecordLayout {
  static constexpr int64_t kAlignment = 64;  // a cache line: every section starts on one

  std::vector<RecordSection> sections;
  int64_t payload_bytes = 0;

  // The sections in the order given, each at the next multiple of `alignment` (a power of two)
  // with bytes = numel * dtype size; payload_bytes is the end of the last, rounded up to
  // `alignment`. Offsets and bytes passed in are ignored. Throws UsageError on an empty or
  // repeated name, a negative dimension or a bad alignment.
  static RecordLayout packed(std::vector<RecordSection> sections, int64_t alignment = kAlignment);

  // Throws UsageError naming `what` and the section when a name is empty or repeated, bytes is not
  // numel * dtype size, a section leaves [0, payload_bytes) or overlaps another, or there are no
  // sections.
  void validate(const std::string& what) const;
  // FNV-1a 64 of the names, dtypes, shapes, offsets and bytes (in order) and payload_bytes: files
  // of another layout (another model, another dtype) carry another hash.
  uint64_t hash() const;
  // The section called `name`, and its index; throw Error naming the sections there are.
  const RecordSection& section(std::string_view name) const;
  int index(std::string_view name) const;
};

// One MoE layer of the store: its record layout and how many experts it has.
struct LayerRecords {
  RecordLayout layout;
  int experts = 0;
};

// The first bytes of every file (little-endian, the host's); the section checksums (u32 CRC32C of
// each section's bytes, in layout order) follow at byte 128, then zeros up to kHeaderBytes, so the
// payload starts on a 4096-byte boundary. Public because it is the format (docs/FORMATS.md) and
// the tests damage it field by field.
struct ExpertFileHeader {
  static constexpr char kMagic[8] = {'M', 'O', 'E', 'S', 'S', 'D', 'X', '\0'};
  static constexpr uint32_t kVersion = 1;
  static constexpr int kMaxSections = 256;  // their checksums fit the header block

  char magic[8];          // kMagic
  uint32_t version;       // kVersion
  uint32_t header_crc;    // CRC32C of these 128 bytes (this field zero), then the section table
  uint64_t run_id;        // random, one per ExpertFiles object: another run's file is refused
  uint64_t layout_hash;   // RecordLayout::hash() of the layer
  uint64_t generation;    // 1 for the expert's first write, +1 for each later one
  int64_t payload_bytes;  // RecordLayout::payload_bytes
  int32_t layer;          // the indices the file was written for
  int32_t expert;
  uint32_t sections;     // n, the layout's section count: u32 checksums at bytes 128..128+4n
  uint32_t reserved0;    // zero
  uint8_t reserved[64];  // zero
};
static_assert(sizeof(ExpertFileHeader) == 128, "the header's size is part of the format");

// How ExpertFiles does its I/O.
struct ExpertFileOptions {
  // read() of a whole record into a 4096-byte-aligned buffer with O_DIRECT: from the device, no
  // copy through the page cache. Up to +25% on cold files (docs/PERFORMANCE.md), for when the
  // files are many times the RAM the page cache could keep them in; much slower for files the
  // page cache would have held (they are read from the device anyway). Other reads, unaligned
  // buffers, and file systems that refuse O_DIRECT (checked at the first open, then never tried
  // again) read through the page cache.
  bool direct_reads = false;
  // Every expert's file is created and its blocks allocated (fallocate) when ExpertFiles is
  // made, so that a disk too small, or filled by other runs or ranks sharing it, is refused then
  // rather than by a write hours later. Skipped where the file system cannot allocate ahead.
  bool reserve_space = true;
};

class ExpertFiles {
 public:
  static constexpr int64_t kHeaderBytes = 4096;  // the payload starts here in every file

  // Bytes of one expert's file (header + payload) and of every file of `layers`.
  static int64_t file_bytes(const RecordLayout& layout);
  static int64_t total_bytes(const std::vector<LayerRecords>& layers);

  // Creates `dir` (the --ssd-dir) if needed and a private run subdirectory in it
  // ("moe-ssd-<pid>-XXXXXX", mode 0700, held by an advisory lock on its `lock` file), with one
  // `layer-LLLL` directory per layer and, by default, every expert's file allocated
  // (ExpertFileOptions::reserve_space; otherwise they appear at their first write). Run
  // subdirectories that no live process holds (a crashed run's) are removed first. Throws
  // UsageError when a layout is invalid or has more than ExpertFileHeader::kMaxSections sections,
  // or a layer has no experts; Error naming --ssd-dir when it
  // is not a writable directory or its file system has less free space than total_bytes(layers)
  // (both numbers in the message).
  ExpertFiles(const std::string& dir, std::vector<LayerRecords> layers,
              ExpertFileOptions options = {});
  // Removes the run subdirectory and every file in it (they are a cache).
  ~ExpertFiles();
  ExpertFiles(const ExpertFiles&) = delete;
  ExpertFiles& operator=(const ExpertFiles&) = delete;

  // Writes the expert's record, layer(layer).layout.payload_bytes bytes at `payload`, as the file's
  // new content: header + payload in one pwritev (short writes and EINTR resumed). Not synced:
  // a crash loses the whole run's cache, which is never read again. On failure (ENOSPC, EIO)
  // throws Error naming the path, layer, expert and the cause; the expert then has no valid
  // copy until a later write succeeds. Thread-safe for different experts; one expert must not be
  // read or written by two threads at once (refused with an Error).
  void write(int layer, int expert, const void* payload) {
    write_prefix(layer, expert, -1, payload);
  }
  // Writes sections [0, end) only (a prefix in layout order; -1: all), with the padding between
  // them: the header gets their new checksums and keeps the others' from the last write, whose
  // bytes stay in the file. For a record whose tail is dead (the store's spent gradient): the
  // write moves fewer bytes and a later read of the tail still verifies (as the old bytes). The
  // whole record is written instead while the file holds no valid copy (before the first write,
  // after a failed one). Errors as write().
  void write_prefix(int layer, int expert, int end, const void* payload);
  // Reads the expert's record into `payload` (payload_bytes bytes) in one preadv and verifies it:
  // header checksum, magic, version, layer, expert, layout, run, the generation of the last
  // write, every section's checksum, padding between sections zero (it is written as zeros,
  // whatever the caller's buffer held there). Throws Error naming the path, layer, expert, what
  // is wrong (the section, when one is damaged) and what to do; `payload` may then hold partial
  // bytes. Thread-safe as write().
  void read(int layer, int expert, void* payload);
  // Reads and verifies sections [begin, end) (layout indices) only: their bytes land at their
  // offsets in `payload` (a whole record's buffer); bytes outside their span are not touched. Two
  // preads (header, span). The span from the first section's start to the last one's end must
  // hold no other section (UsageError otherwise; packed layouts keep index order).
  void read_sections(int layer, int expert, int begin, int end, void* payload);
  // Asks the kernel to start reading the expert's file into the page cache (posix_fadvise
  // WILLNEED), so a read() soon after finds it there. Advisory: throws only on indices out of
  // range; a no-op before the first write.
  void will_need(int layer, int expert) const;

  // True after a successful write() of that expert (and no failed one since).
  bool written(int layer, int expert) const;
  // Where the expert's file is (for messages; it may not exist yet).
  std::string path(int layer, int expert) const;
  const std::string& directory() const { return dir_; }          // the --ssd-dir, as given
  const std::string& run_directory() const { return run_dir_; }  // this object's subdirectory
  int num_layers() const { return static_cast<int>(layers_.size()); }
  const LayerRecords& layer(int index) const;

  // Payload bytes moved by successful write()s and read()s / read_sections(), and how many there
  // were.
  int64_t bytes_written() const { return bytes_written_.load(std::memory_order_relaxed); }
  int64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }
  int64_t writes() const { return writes_.load(std::memory_order_relaxed); }
  int64_t reads() const { return reads_.load(std::memory_order_relaxed); }
  // How many reads went around the page cache (ExpertFileOptions::direct_reads).
  int64_t direct_reads() const { return direct_reads_.load(std::memory_order_relaxed); }
  // Seconds spent in successful write()s and read()s / read_sections() (opening, I/O and
  // checksums; summed over the threads that called them).
  double write_seconds() const { return 1e-9 * double(write_ns_.load(std::memory_order_relaxed)); }
  double read_seconds() const { return 1e-9 * double(read_ns_.load(std::memory_order_relaxed)); }

 private:
  // What this object knows about one expert's file: what its header must say at the next read.
  struct Slot {
    std::atomic<bool> busy{false};   // a read or write is in progress
    uint64_t generation = 0;         // of the last write attempted (0: never written)
    uint32_t table_crc = 0;          // CRC32C of the section checksums of the last write
    std::vector<uint32_t> crcs;      // the section checksums in the file's header
    std::atomic<bool> valid{false};  // the last write succeeded
  };
  class Claim;  // sets and clears Slot::busy
  // [0, payload_bytes) cut at section boundaries, in offset order: a section, or padding (-1).
  struct Piece {
    int64_t offset = 0, bytes = 0;
    int section = -1;
  };

  Slot& slot(int layer, int expert) const;         // checks the indices
  std::string where(int layer, int expert) const;  // "layer L expert E ('path')"
  void reserve_space();                            // ExpertFileOptions::reserve_space
  void read_span(int layer, int expert, int begin, int end, void* payload);

  std::string dir_, run_dir_;
  std::vector<LayerRecords> layers_;
  std::vector<uint64_t> layout_hashes_;
  std::vector<std::vector<Piece>> pieces_;      // [L]
  std::vector<unsigned char> zeros_;            // the longest padding piece, written from here
  std::vector<std::unique_ptr<Slot[]>> slots_;  // [L][E]
  ExpertFileOptions options_;
  std::atomic<bool> direct_supported_{true};  // until the file system refuses O_DIRECT
  uint64_t run_id_ = 0;
  int lock_fd_ = -1;
  std::atomic<int64_t> bytes_written_{0}, bytes_read_{0}, writes_{0}, reads_{0}, direct_reads_{0};
  std::atomic<int64_t> write_ns_{0}, read_ns_{0};
};

// Collective over `world` (every rank that makes an SSD tier): the tiers of the ranks on one node
// whose `dir`s lie on one file system, `bytes` each (ExpertFiles::total_bytes), are checked
// together against its free space, before any of them creates a file; each ExpertFiles checks
// only its own, so ranks sharing a disk would otherwise fill it file by file. Throws moe::Error
// naming --ssd-dir, how many ranks share it, what they need in all and what is free; the ranks
// of that node and file system all throw it.
void check_shared_ssd_space(comm::Communicator& world, const std::string& dir, int64_t bytes);

}  // namespace moe::offload
