// The SSD tier's per-(layer, expert) files (see moe/offload/expert_file.h, docs/FORMATS.md).
// Letters: L layers, E experts of a layer.
#include "moe/offload/expert_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include "moe/checksum.h"
#include "moe/error.h"
#include "moe/models/memory.h"
#include "moe/offload/budget.h"
#include "moe/rng.h"
#include "moe/settings.h"

namespace moe::offload {

namespace fs = std::filesystem;

// The header's fields sit where docs/FORMATS.md says.
static_assert(offsetof(ExpertFileHeader, version) == 8 &&
              offsetof(ExpertFileHeader, header_crc) == 12 &&
              offsetof(ExpertFileHeader, run_id) == 16 &&
              offsetof(ExpertFileHeader, layout_hash) == 24 &&
              offsetof(ExpertFileHeader, generation) == 32 &&
              offsetof(ExpertFileHeader, payload_bytes) == 40 &&
              offsetof(ExpertFileHeader, layer) == 48 && offsetof(ExpertFileHeader, expert) == 52 &&
              offsetof(ExpertFileHeader, sections) == 56 &&
              offsetof(ExpertFileHeader, reserved) == 64);

namespace {

constexpr const char* kRunPrefix = "moe-ssd-";
constexpr const char* kLockName = "lock";

// Closes a descriptor when the scope ends (errors of close() on a read-only fd mean nothing).
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int release() { return std::exchange(fd, -1); }
};

std::string bytes_text(int64_t bytes) {
  if (bytes < 1024) return str(bytes, " bytes");
  return str(bytes, " bytes (", format_bytes(static_cast<double>(bytes)), ")");
}

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// What the caller can do about a failed write, by cause.
std::string write_advice(int error) {
  if (error == ENOSPC || error == EDQUOT)
    return str("the file system of ", flag_for(Setting::ssd_dir),
               " is full: free space there or choose another ", flag_for(Setting::ssd_dir),
               " (the SSD tier needs room for every expert's file)");
  if (error == ENOENT)
    return str(
        "its directory was removed while the run used it: keep other programs and "
        "cleanups out of ",
        flag_for(Setting::ssd_dir));
  return str("check the device and file system of ", flag_for(Setting::ssd_dir),
             " (dmesg), or choose another ", flag_for(Setting::ssd_dir));
}

// One pwritev/preadv at `offset` over `iov`, resumed after short transfers and EINTR. Returns the
// bytes moved: all of them, or fewer when a read meets the end of the file. On an error, returns
// the bytes moved before it and sets `error` (errno); 0 otherwise. `direct` (an O_DIRECT read of
// whole blocks) takes a short read as the end of the file: resuming it would be unaligned.
int64_t transfer(int fd, std::vector<iovec> iov, int64_t offset, bool writing, int& error,
                 bool direct = false) {
  error = 0;
  int64_t done = 0;
  size_t first = 0;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    const int count = static_cast<int>(iov.size() - first);
    const ssize_t n = writing ? ::pwritev(fd, iov.data() + first, count, offset)
                              : ::preadv(fd, iov.data() + first, count, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      error = errno;
      return done;
    }
    if (n == 0) {
      if (writing) error = EIO;  // a write that moves nothing and reports no error: give up
      return done;               // a read: end of file
    }
    done += n;
    offset += n;
    if (direct) return done;
    for (size_t left = static_cast<size_t>(n); left > 0;) {
      const size_t step = std::min(left, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + step;
      iov[first].iov_len -= step;
      left -= step;
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return done;
}

constexpr int64_t kTableOffset = sizeof(ExpertFileHeader);  // the section checksums

// CRC32C of a header block: the 128-byte header with header_crc zero, then `sections` checksums.
uint32_t header_checksum(const unsigned char* block, uint32_t sections) {
  ExpertFileHeader header;
  std::memcpy(&header, block, sizeof header);
  header.header_crc = 0;
  return crc32c(block + kTableOffset, 4 * static_cast<size_t>(sections),
                crc32c(&header, sizeof header));
}

uint64_t fresh_run_id() {
  std::random_device device;
  const uint64_t random = (static_cast<uint64_t>(device()) << 32) ^ device();
  const auto now =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return rng_key(random, {now, static_cast<uint64_t>(::getpid())});
}

// Run subdirectories whose lock no live process holds belong to a run that died without its
// destructor (a crash, a kill): their files are never read again, so they only take space. A
// directory still being set up has no `lock` yet (it is renamed into place already locked) and
// is left alone.
void remove_abandoned_runs(const std::string& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(kRunPrefix, 0) != 0 || !it->is_directory(ec) || it->is_symlink(ec)) continue;
    Fd lock(::open((it->path() / kLockName).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (lock.fd < 0 || ::flock(lock.fd, LOCK_EX | LOCK_NB) != 0) continue;
    std::error_code ignored;
    fs::remove_all(it->path(), ignored);
  }
}

}  // namespace

// ----------------------------------------------------------------------------- RecordLayout

RecordLayout RecordLayout::packed(std::vector<RecordSection> sections, int64_t alignment) {
  MOE_USAGE_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0,
                  "RecordLayout::packed: alignment ", alignment, " is not a power of two");
  RecordLayout layout;
  int64_t end = 0;
  for (RecordSection& s : sections) {
    for (int64_t d : s.shape)
      MOE_USAGE_CHECK(d >= 0, "record section '", s.name, "': negative dimension in shape ",
                      shape_str(s.shape));
    s.offset = round_up(end, alignment);
    s.bytes = shape_numel(s.shape) * static_cast<int64_t>(dtype_size(s.dtype));
    end = s.offset + s.bytes;
  }
  layout.sections = std::move(sections);
  layout.payload_bytes = round_up(end, alignment);
  layout.validate("RecordLayout::packed");
  return layout;
}

void RecordLayout::validate(const std::string& what) const {
  MOE_USAGE_CHECK(!sections.empty(), what, ": a record layout needs at least one section");
  MOE_USAGE_CHECK(payload_bytes > 0, what, ": payload_bytes ", payload_bytes, " must be positive");
  std::vector<const RecordSection*> by_offset;
  for (const RecordSection& s : sections) {
    MOE_USAGE_CHECK(!s.name.empty(), what, ": a record section has an empty name");
    for (const RecordSection& t : sections)
      MOE_USAGE_CHECK(&t == &s || t.name != s.name, what, ": record section '", s.name,
                      "' appears twice");
    for (int64_t d : s.shape)
      MOE_USAGE_CHECK(d >= 0, what, ": record section '", s.name, "' has shape ",
                      shape_str(s.shape));
    const int64_t expected = shape_numel(s.shape) * static_cast<int64_t>(dtype_size(s.dtype));
    MOE_USAGE_CHECK(s.bytes == expected, what, ": record section '", s.name, "' (",
                    dtype_name(s.dtype), " ", shape_str(s.shape), ") has ", s.bytes,
                    " bytes, expected ", expected);
    MOE_USAGE_CHECK(s.offset >= 0 && s.offset + s.bytes <= payload_bytes, what,
                    ": record section '", s.name, "' at [", s.offset, ", ", s.offset + s.bytes,
                    ") leaves the payload of ", payload_bytes, " bytes");
    by_offset.push_back(&s);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const RecordSection* a, const RecordSection* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const RecordSection& a = *by_offset[i - 1];
    const RecordSection& b = *by_offset[i];
    MOE_USAGE_CHECK(a.offset + a.bytes <= b.offset, what, ": record sections '", a.name, "' and '",
                    b.name, "' overlap");
  }
}

uint64_t RecordLayout::hash() const {
  // A canonical text of everything that decides how the payload's bytes are read.
  std::string text = str("moe.ssd.layout;payload=", payload_bytes, ";");
  for (const RecordSection& s : sections)
    text += str(s.name, '\0', dtype_name(s.dtype), '\0', shape_str(s.shape), '\0', s.offset, '\0',
                s.bytes, ';');
  return hash_name(text);
}

const RecordSection& RecordLayout::section(std::string_view name) const {
  return sections[static_cast<size_t>(index(name))];
}

int RecordLayout::index(std::string_view name) const {
  for (size_t i = 0; i < sections.size(); ++i)
    if (sections[i].name == name) return static_cast<int>(i);
  std::string names;
  for (const RecordSection& s : sections) names += str(names.empty() ? "" : ", ", s.name);
  throw Error(str("record layout has no section '", name, "' (it has ", names, ")"));
}

// ----------------------------------------------------------------------------- ExpertFiles

class ExpertFiles::Claim {
 public:
  Claim(Slot& slot, const std::string& where, const char* op) : slot_(slot) {
    bool idle = false;
    if (!slot_.busy.compare_exchange_strong(idle, true, std::memory_order_acquire))
      throw Error(str(where, ": ", op, " while another read or write of the same expert is in ",
                      "progress (the store must serialise each expert's I/O)"));
  }
  ~Claim() { slot_.busy.store(false, std::memory_order_release); }
  Claim(const Claim&) = delete;
  Claim& operator=(const Claim&) = delete;

 private:
  Slot& slot_;
};

int64_t ExpertFiles::file_bytes(const RecordLayout& layout) {
  return kHeaderBytes + layout.payload_bytes;
}

int64_t ExpertFiles::total_bytes(const std::vector<LayerRecords>& layers) {
  int64_t total = 0;
  // Each file takes whole file-system blocks: round up to the common 4096.
  for (const LayerRecords& l : layers)
    total += static_cast<int64_t>(l.experts) * round_up(file_bytes(l.layout), 4096);
  return total;
}

ExpertFiles::ExpertFiles(const std::string& dir, std::vector<LayerRecords> layers,
                         ExpertFileOptions options)
    : dir_(dir), layers_(std::move(layers)), options_(options) {
  MOE_USAGE_CHECK(!dir_.empty(), flag_for(Setting::ssd_dir),
                  " is empty: name a directory for the SSD expert tier");
  MOE_USAGE_CHECK(!layers_.empty(), "the SSD expert tier needs at least one layer");
  for (size_t l = 0; l < layers_.size(); ++l) {
    const std::string what = str("SSD expert tier, layer ", l);
    layers_[l].layout.validate(what);
    MOE_USAGE_CHECK(layers_[l].experts > 0, what, ": ", layers_[l].experts,
                    " experts (must be positive)");
    const std::vector<RecordSection>& sections = layers_[l].layout.sections;
    MOE_USAGE_CHECK(sections.size() <= static_cast<size_t>(ExpertFileHeader::kMaxSections), what,
                    ": ", sections.size(), " record sections, at most ",
                    ExpertFileHeader::kMaxSections, " (their checksums fill the file's header)");
    std::vector<Piece> pieces;
    for (size_t i = 0; i < sections.size(); ++i)
      pieces.push_back({sections[i].offset, sections[i].bytes, static_cast<int>(i)});
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
    std::vector<Piece> cut;  // with the padding before, between and after the sections
    int64_t end = 0;
    for (const Piece& piece : pieces) {
      if (piece.offset > end) cut.push_back({end, piece.offset - end, -1});
      if (piece.bytes > 0) cut.push_back(piece);
      end = std::max(end, piece.offset + piece.bytes);
    }
    if (layers_[l].layout.payload_bytes > end)
      cut.push_back({end, layers_[l].layout.payload_bytes - end, -1});
    for (const Piece& piece : cut)
      if (piece.section < 0 && static_cast<size_t>(piece.bytes) > zeros_.size())
        zeros_.resize(static_cast<size_t>(piece.bytes), 0);
    pieces_.push_back(std::move(cut));
    layout_hashes_.push_back(layers_[l].layout.hash());
    slots_.push_back(std::make_unique<Slot[]>(static_cast<size_t>(layers_[l].experts)));
  }

  std::error_code ec, status_error;
  fs::create_directories(dir_, ec);
  // The error_code forms: a failure (EACCES, ENOTDIR) is a message, never a filesystem_error.
  const fs::file_status status = fs::status(dir_, status_error);
  if (!fs::is_directory(status)) {
    if (fs::exists(status))
      throw Error(str(flag_for(Setting::ssd_dir), " '", dir_,
                      "' is not a directory: name a directory (it is created when missing)"));
    throw Error(str(flag_for(Setting::ssd_dir), " '", dir_, "': cannot create it: ",
                    (ec ? ec : status_error).message(), "; name a writable directory"));
  }
  remove_abandoned_runs(dir_);

  std::string run = str(dir_, "/", kRunPrefix, ::getpid(), "-XXXXXX");
  if (::mkdtemp(run.data()) == nullptr)
    throw Error(str(flag_for(Setting::ssd_dir), " '", dir_,
                    "' is not writable: cannot create a run directory in it: ",
                    std::strerror(errno), "; name a writable directory"));
  run_dir_ = run;
  try {
    // After mkdtemp, so an unwritable directory is named as such, not as a full one.
    const int64_t free = offload::free_bytes(dir_);
    if (free < 0)
      throw Error(str(flag_for(Setting::ssd_dir), " '", dir_,
                      "': cannot query its file system: ", std::strerror(errno)));
    const int64_t needed = total_bytes(layers_);
    if (needed > free)
      throw Error(str(flag_for(Setting::ssd_dir), " '", dir_, "': the SSD expert tier needs ",
                      bytes_text(needed), " for ", layers_.size(),
                      " layers' expert files, but its file system has ", bytes_text(free),
                      " free; free space there, choose a larger ", flag_for(Setting::ssd_dir), ", ",
                      "or give the host tier more memory"));
    // Locked before it gets its name, so remove_abandoned_runs never sees it unlocked.
    const std::string temp_lock = run_dir_ + "/.lock-new";
    Fd lock(::open(temp_lock.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (lock.fd < 0)
      throw Error(str(flag_for(Setting::ssd_dir), " '", dir_, "': cannot create '", temp_lock,
                      "': ", std::strerror(errno)));
    // A file system without flock (some network ones) leaves the run unlocked: it is then
    // never removed by another run, which is the safe side.
    (void)::flock(lock.fd, LOCK_EX | LOCK_NB);
    if (std::rename(temp_lock.c_str(), (run_dir_ + "/" + kLockName).c_str()) != 0)
      throw Error(str(flag_for(Setting::ssd_dir), " '", dir_, "': cannot rename '", temp_lock,
                      "': ", std::strerror(errno)));
    lock_fd_ = lock.release();
    for (size_t l = 0; l < layers_.size(); ++l) {
      char name[32];
      std::snprintf(name, sizeof name, "/layer-%04zu", l);
      if (::mkdir((run_dir_ + name).c_str(), 0700) != 0)
        throw Error(str(flag_for(Setting::ssd_dir), " '", dir_, "': cannot create '", run_dir_,
                        name, "': ", std::strerror(errno)));
    }
    if (options_.reserve_space) reserve_space();
    run_id_ = fresh_run_id();
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(run_dir_, ignored);
    if (lock_fd_ >= 0) ::close(lock_fd_);
    throw;
  }
}

void ExpertFiles::reserve_space() {
  // fallocate(2), not posix_fallocate: where the file system cannot allocate without writing,
  // glibc's emulation would write every byte; there the reservation is skipped instead.
  const int64_t total = total_bytes(layers_);
  int64_t reserved = 0;
  for (int l = 0; l < num_layers(); ++l) {
    const int64_t bytes = file_bytes(layers_[static_cast<size_t>(l)].layout);
    for (int e = 0; e < layers_[static_cast<size_t>(l)].experts; ++e) {
      const std::string file = path(l, e);
      Fd fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (fd.fd < 0)
        throw Error(str(flag_for(Setting::ssd_dir), " '", dir_, "': cannot create '", file,
                        "': ", std::strerror(errno)));
      if (::fallocate(fd.fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
        const int error = errno;
        if (error == EOPNOTSUPP || error == ENOSYS) return;  // files grow at their first write
        throw Error(str(flag_for(Setting::ssd_dir), " '", dir_,
                        "': cannot reserve the SSD expert tier's ", bytes_text(total), ": ",
                        std::strerror(error), " at '", file, "' after ", bytes_text(reserved),
                        " (other runs or ranks filling the same disk?); ", write_advice(error)));
      }
      reserved += round_up(bytes, 4096);
    }
  }
}

ExpertFiles::~ExpertFiles() {
  std::error_code ignored;
  fs::remove_all(run_dir_, ignored);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

const LayerRecords& ExpertFiles::layer(int index) const {
  MOE_CHECK(index >= 0 && index < num_layers(), "SSD expert tier: layer ", index,
            " out of range [0, ", num_layers(), ")");
  return layers_[static_cast<size_t>(index)];
}

std::string ExpertFiles::path(int layer, int expert) const {
  char name[48];
  std::snprintf(name, sizeof name, "/layer-%04d/expert-%05d.bin", layer, expert);
  return run_dir_ + name;
}

std::string ExpertFiles::where(int layer, int expert) const {
  return str("SSD expert file '", path(layer, expert), "' (layer ", layer, ", expert ", expert,
             ")");
}

ExpertFiles::Slot& ExpertFiles::slot(int layer, int expert) const {
  const LayerRecords& records = this->layer(layer);
  MOE_CHECK(expert >= 0 && expert < records.experts, "SSD expert tier: expert ", expert,
            " of layer ", layer, " out of range [0, ", records.experts, ")");
  return slots_[static_cast<size_t>(layer)][static_cast<size_t>(expert)];
}

bool ExpertFiles::written(int layer, int expert) const { return slot(layer, expert).valid; }

namespace {
int64_t nanos_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}
}  // namespace

void ExpertFiles::write_prefix(int layer, int expert, int end, const void* payload) {
  const auto start = std::chrono::steady_clock::now();
  Slot& s = slot(layer, expert);
  const std::string file = path(layer, expert);
  Claim claim(s, where(layer, expert), "write");
  const RecordLayout& layout = layers_[static_cast<size_t>(layer)].layout;
  const auto* bytes = static_cast<const unsigned char*>(payload);
  const auto sections = static_cast<uint32_t>(layout.sections.size());
  MOE_USAGE_CHECK(end == -1 || (end >= 1 && end <= static_cast<int>(sections)),
                  "cannot write sections [0, ", end, ") of ", where(layer, expert),
                  ": the layout has sections [0, ", sections, ")");
  // Sections [0, written) get new bytes; without a valid copy in the file, all of them.
  const uint32_t written = end < 0 || !s.valid ? sections : static_cast<uint32_t>(end);
  const int64_t span_end = written == sections ? layout.payload_bytes
                                               : layout.sections[written - 1].offset +
                                                     layout.sections[written - 1].bytes;
  for (uint32_t i = written; i < sections; ++i)  // packed layouts keep index order
    MOE_USAGE_CHECK(layout.sections[i].offset >= span_end, "cannot write sections [0, ", end,
                    ") of ", where(layer, expert), ": section '", layout.sections[i].name,
                    "' lies among them");

  s.valid = false;  // until this write has landed whole
  alignas(64) unsigned char block[kHeaderBytes] = {};
  ExpertFileHeader header{};
  std::memcpy(header.magic, ExpertFileHeader::kMagic, sizeof header.magic);
  header.version = ExpertFileHeader::kVersion;
  header.run_id = run_id_;
  header.layout_hash = layout_hashes_[static_cast<size_t>(layer)];
  header.generation = ++s.generation;
  header.payload_bytes = layout.payload_bytes;
  header.layer = layer;
  header.expert = expert;
  header.sections = sections;
  s.crcs.resize(sections);
  for (uint32_t i = 0; i < written; ++i) {
    const RecordSection& section = layout.sections[i];
    s.crcs[i] = crc32c(bytes + section.offset, static_cast<size_t>(section.bytes));
  }
  std::memcpy(block + kTableOffset, s.crcs.data(), 4 * static_cast<size_t>(sections));
  std::memcpy(block, &header, sizeof header);
  header.header_crc = header_checksum(block, sections);
  std::memcpy(block, &header, sizeof header);

  // Header block, then the sections from the caller's buffer and the padding as zeros.
  std::vector<iovec> iov{{block, sizeof block}};
  for (const Piece& piece : pieces_[static_cast<size_t>(layer)])
    if (piece.offset < span_end)
      iov.push_back(
          {piece.section >= 0 ? const_cast<unsigned char*>(bytes + piece.offset) : zeros_.data(),
           static_cast<size_t>(piece.bytes)});
  Fd fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  if (fd.fd < 0) {
    const int error = errno;
    throw Error(str("cannot write ", where(layer, expert), ": ", std::strerror(error), "; ",
                    write_advice(error)));
  }
  int error = 0;
  const int64_t done = transfer(fd.fd, std::move(iov), 0, true, error);
  if (error == 0 && ::close(fd.release()) != 0) error = errno;  // NFS reports late errors here
  if (error != 0)
    throw Error(str("cannot write ", where(layer, expert), ": ", std::strerror(error), " after ",
                    done, " of ", kHeaderBytes + span_end, " bytes; ", write_advice(error)));
  s.table_crc = crc32c(block + kTableOffset, 4 * static_cast<size_t>(sections));
  s.valid = true;
  bytes_written_.fetch_add(span_end, std::memory_order_relaxed);
  writes_.fetch_add(1, std::memory_order_relaxed);
  write_ns_.fetch_add(nanos_since(start), std::memory_order_relaxed);
}

void ExpertFiles::read(int layer, int expert, void* payload) {
  read_span(layer, expert, 0, static_cast<int>(this->layer(layer).layout.sections.size()), payload);
}

void ExpertFiles::read_sections(int layer, int expert, int begin, int end, void* payload) {
  read_span(layer, expert, begin, end, payload);
}

void ExpertFiles::read_span(int layer, int expert, int begin, int end, void* payload) {
  const auto start = std::chrono::steady_clock::now();
  Slot& s = slot(layer, expert);
  const std::string file = path(layer, expert);
  const std::string at = where(layer, expert);
  const RecordLayout& layout = layers_[static_cast<size_t>(layer)].layout;
  const int sections = static_cast<int>(layout.sections.size());
  MOE_USAGE_CHECK(0 <= begin && begin < end && end <= sections, "cannot read sections [", begin,
                  ", ", end, ") of ", at, ": the layout has sections [0, ", sections, ")");
  // The file bytes to read: the whole payload, or the span of the sections asked for.
  const bool whole = begin == 0 && end == sections;
  int64_t span_begin = whole ? 0 : INT64_MAX, span_end = whole ? layout.payload_bytes : 0;
  for (int i = begin; i < end && !whole; ++i) {
    span_begin = std::min(span_begin, layout.sections[i].offset);
    span_end = std::max(span_end, layout.sections[i].offset + layout.sections[i].bytes);
  }
  for (int i = 0; i < sections; ++i) {
    const RecordSection& other = layout.sections[i];
    MOE_USAGE_CHECK((i >= begin && i < end) || other.bytes == 0 ||
                        other.offset + other.bytes <= span_begin || other.offset >= span_end,
                    "cannot read sections [", begin, ", ", end, ") of ", at, ": section '",
                    other.name, "' lies between them (read it too, or reorder the layout)");
  }
  Claim claim(s, at, "read");
  if (!s.valid)
    throw Error(str("cannot read ", at, ": ",
                    s.generation == 0 ? "it was never written"
                                      : "its last write failed, so it holds no valid copy",
                    " (the store must write an expert before reading it back)"));
  // What the caller can do about a file that is not what this run wrote.
  const auto damaged = [] {
    return str(
        "the SSD tier is a cache of this run: something damaged or replaced the file (a disk or "
        "file-system error, or another program writing in ",
        flag_for(Setting::ssd_dir), "); restart from the last checkpoint");
  };

  // O_DIRECT for whole records into 4096-aligned buffers when asked for (and while the file
  // system takes it): the bytes come from the device without a copy through the page cache.
  auto* bytes = static_cast<unsigned char*>(payload);
  bool direct = options_.direct_reads && whole &&
                direct_supported_.load(std::memory_order_relaxed) &&
                reinterpret_cast<uintptr_t>(payload) % kHeaderBytes == 0;
  int raw_fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (raw_fd < 0 && direct && errno == EINVAL) {  // a file system without O_DIRECT
    direct_supported_.store(false, std::memory_order_relaxed);
    direct = false;
    raw_fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  }
  Fd fd(raw_fd);
  if (fd.fd < 0) {
    const int error = errno;
    if (error == ENOENT)
      throw Error(str("cannot read ", at, ": the file is missing (removed while the run used it: ",
                      "keep other programs and cleanups out of ", flag_for(Setting::ssd_dir),
                      "); restart from the last ", "checkpoint"));
    throw Error(str("cannot read ", at, ": ", std::strerror(error),
                    "; check the device and file system of ", flag_for(Setting::ssd_dir)));
  }
  alignas(4096) unsigned char block[kHeaderBytes];
  const int64_t needed = kHeaderBytes + span_end;  // the file must reach this far
  int error = 0;
  int64_t header_got = 0, span_got = 0;
  if (direct) {
    // Whole blocks only: the payload's last partial block lands in `tail` and is copied out.
    alignas(4096) unsigned char tail[kHeaderBytes];
    const int64_t head = span_end / kHeaderBytes * kHeaderBytes, rest = span_end - head;
    std::vector<iovec> iov{{block, sizeof block}};
    if (head > 0) iov.push_back({bytes, static_cast<size_t>(head)});
    if (rest > 0) iov.push_back({tail, sizeof tail});
    const int64_t got = transfer(fd.fd, std::move(iov), 0, false, error, true);
    header_got = std::min<int64_t>(got, kHeaderBytes);
    span_got = std::min(got - header_got, span_end);
    if (span_got > head) std::memcpy(bytes + head, tail, static_cast<size_t>(span_got - head));
    if (error == 0 && span_got == span_end) {
      direct_reads_.fetch_add(1, std::memory_order_relaxed);
    } else {
      // Short or refused (EINVAL: an alignment the device wants and we do not meet): read it
      // again through the page cache, whose path tells the end of the file from an error.
      if (error == EINVAL) direct_supported_.store(false, std::memory_order_relaxed);
      direct = false;
      error = 0;
      header_got = span_got = 0;
      const int flags = ::fcntl(fd.fd, F_GETFL);
      if (flags == -1 || ::fcntl(fd.fd, F_SETFL, flags & ~O_DIRECT) == -1) error = errno;
    }
  }
  if (!direct && error == 0) {
    if (span_begin == 0) {
      // One preadv of header + span when the span starts the payload (a whole record), else two.
      const int64_t got = transfer(
          fd.fd, {{block, sizeof block}, {bytes, static_cast<size_t>(span_end)}}, 0, false, error);
      header_got = std::min<int64_t>(got, kHeaderBytes);
      span_got = got - header_got;
    } else {
      header_got = transfer(fd.fd, {{block, sizeof block}}, 0, false, error);
      if (error == 0 && header_got == kHeaderBytes)
        span_got =
            transfer(fd.fd, {{bytes + span_begin, static_cast<size_t>(span_end - span_begin)}},
                     kHeaderBytes + span_begin, false, error);
    }
  }
  const int64_t reached =
      header_got < kHeaderBytes ? header_got : kHeaderBytes + span_begin + span_got;
  if (error != 0)
    throw Error(str("cannot read ", at, ": ", std::strerror(error), " after byte ", reached, " of ",
                    needed, "; check the device and file system of ", flag_for(Setting::ssd_dir),
                    " (dmesg)"));
  if (header_got < static_cast<int64_t>(sizeof(ExpertFileHeader)) ||
      std::memcmp(block, ExpertFileHeader::kMagic, sizeof ExpertFileHeader::kMagic) != 0)
    throw Error(str("cannot read ", at, ": not an SSD expert file (",
                    header_got < static_cast<int64_t>(sizeof(ExpertFileHeader))
                        ? str("only ", header_got, " bytes")
                        : std::string("no MOESSDX magic"),
                    "); ", damaged()));
  ExpertFileHeader header;
  std::memcpy(&header, block, sizeof header);
  if (header.version != ExpertFileHeader::kVersion)
    throw Error(str("cannot read ", at, ": format version ", header.version,
                    ", this build reads version ", ExpertFileHeader::kVersion, "; ", damaged()));
  if (header_got < kHeaderBytes ||
      header.sections > static_cast<uint32_t>(ExpertFileHeader::kMaxSections) ||
      header.header_crc != header_checksum(block, header.sections))
    throw Error(
        str("cannot read ", at, ": its header is damaged (header checksum mismatch); ", damaged()));
  // The checksum covers the header and the section table; the rest of the block, most of it, is
  // written as zeros and checked as such, so that damage anywhere in it is seen.
  const unsigned char* fill = block + kTableOffset + 4 * static_cast<size_t>(header.sections);
  const unsigned char* end_of_block = block + kHeaderBytes;
  if (const unsigned char* bad =
          std::find_if(fill, end_of_block, [](unsigned char b) { return b != 0; });
      bad != end_of_block)
    throw Error(str("cannot read ", at, ": its header is damaged (byte ", bad - block,
                    " of the header block, written as zero, is not); ", damaged()));
  if (header.layer != layer || header.expert != expert)
    throw Error(str("cannot read ", at, ": it holds layer ", header.layer, " expert ",
                    header.expert, "; ", damaged()));
  if (header.layout_hash != layout_hashes_[static_cast<size_t>(layer)] ||
      header.payload_bytes != layout.payload_bytes ||
      header.sections != static_cast<uint32_t>(sections))
    throw Error(str(
        "cannot read ", at, ": it was written for another record layout (", header.payload_bytes,
        " payload bytes in ", header.sections, " sections, layout hash ", header.layout_hash,
        "; this layer has ", layout.payload_bytes, " bytes in ", sections, ", hash ",
        layout_hashes_[static_cast<size_t>(layer)], "): another model's file; ", damaged()));
  if (header.run_id != run_id_)
    throw Error(str("cannot read ", at, ": it was written by another run; ", damaged()));
  if (header.generation != s.generation)
    throw Error(str("cannot read ", at, ": it holds write ", header.generation,
                    " of this expert, the last write was ", s.generation, " (stale data); ",
                    damaged()));
  if (crc32c(block + kTableOffset, 4 * static_cast<size_t>(sections)) != s.table_crc)
    throw Error(str("cannot read ", at, ": its section checksums are not those of the last write; ",
                    damaged()));
  if (reached < needed)
    throw Error(str("cannot read ", at, ": truncated (it ends at byte ", reached, " of ", needed,
                    "); ", damaged()));
  for (const Piece& piece : pieces_[static_cast<size_t>(layer)]) {
    if (piece.offset < span_begin || piece.offset + piece.bytes > span_end) continue;
    const unsigned char* data = bytes + piece.offset;
    if (piece.section < 0) {  // padding: written as zeros
      if (std::any_of(data, data + piece.bytes, [](unsigned char b) { return b != 0; }))
        throw Error(str("cannot read ", at, ": padding bytes [", piece.offset, ", ",
                        piece.offset + piece.bytes, ") of the payload are not zero: the data is ",
                        "damaged; ", damaged()));
      continue;
    }
    uint32_t stored;
    std::memcpy(&stored, block + kTableOffset + 4 * piece.section, 4);
    const uint32_t crc = crc32c(data, static_cast<size_t>(piece.bytes));
    if (crc != stored)
      throw Error(str("cannot read ", at, ": section '", layout.sections[piece.section].name,
                      "' checksum mismatch (CRC32C ", crc, ", written as ", stored,
                      "): the data is damaged; ", damaged()));
  }
  bytes_read_.fetch_add(span_end - span_begin, std::memory_order_relaxed);
  reads_.fetch_add(1, std::memory_order_relaxed);
  read_ns_.fetch_add(nanos_since(start), std::memory_order_relaxed);
}

namespace {

// The file system holding `dir`, or its nearest existing ancestor (the directory may not exist
// yet); 0 when none can be examined.
uint64_t file_system_of(const std::string& dir) {
  fs::path p = dir.empty() ? fs::path(".") : fs::absolute(fs::path(dir));
  struct stat st {};
  while (::stat(p.c_str(), &st) != 0) {
    if (!p.has_parent_path() || p.parent_path() == p) return 0;
    p = p.parent_path();
  }
  return static_cast<uint64_t>(st.st_dev);
}

}  // namespace

void check_shared_ssd_space(comm::Communicator& world, const std::string& dir, int64_t bytes) {
  // Per rank of this node: its file system, the bytes its tier needs, what is free there.
  const std::unique_ptr<comm::Communicator> node = world.split_node();
  const int ranks = node->size();
  Tensor mine = Tensor::empty({3}, DType::i64);
  mine.data<int64_t>()[0] = static_cast<int64_t>(file_system_of(dir));
  mine.data<int64_t>()[1] = bytes;
  mine.data<int64_t>()[2] = offload::free_bytes(dir);
  Tensor all = Tensor::empty({3 * static_cast<int64_t>(ranks)}, DType::i64);
  node->all_gather(mine, all);
  const int64_t* row = all.data<int64_t>();
  int64_t needed = 0, free = INT64_MAX;
  int sharing = 0;
  for (int r = 0; r < ranks; ++r) {
    if (row[3 * r] != mine.data<int64_t>()[0]) continue;
    ++sharing;
    needed += row[3 * r + 1];
    if (row[3 * r + 2] >= 0) free = std::min(free, row[3 * r + 2]);
  }
  if (sharing > 1 && needed > free)
    throw Error(str(flag_for(Setting::ssd_dir), " '", dir, "': the SSD expert tiers of the ",
                    sharing, " ranks on this node that share its file system need ",
                    bytes_text(needed), " in all (", bytes_text(bytes), " here), but it has ",
                    bytes_text(free), " free; free space there, give each rank an ",
                    flag_for(Setting::ssd_dir),
                    " on its own disk, "
                    "or give the host tier more memory"));
}

void ExpertFiles::will_need(int layer, int expert) const {
  if (!slot(layer, expert).valid) return;
  Fd fd(::open(path(layer, expert).c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.fd >= 0) (void)::posix_fadvise(fd.fd, 0, 0, POSIX_FADV_WILLNEED);
}

}  // namespace moe::offload
