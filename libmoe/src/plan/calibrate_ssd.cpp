// The SSD measurement of moe-plan calibrate: a temporary file in the scratch directory, written
// and fsync'ed, then read back, bypassing the page cache (O_DIRECT with 4096-aligned buffers, or,
// where the file system refuses O_DIRECT (tmpfs), the cached pages dropped with posix_fadvise
// before reading: a read from memory would report RAM's bandwidth as the disk's). The file is
// removed whatever happens.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "moe/error.h"
#include "moe/timer.h"
#include "plan/calibrate_measure.h"
#include "plan/check.h"

namespace moe::plan::measure {

namespace {

constexpr size_t kAlign = 4096;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

struct RemoveFile {
  std::string path;
  ~RemoveFile() { ::unlink(path.c_str()); }
};

std::string scratch_error(const std::string& dir, const std::string& what) {
  return str("scratch directory '", dir, "': ", what, ": ", std::strerror(errno));
}

// Opens `path` with `flags`, adding O_DIRECT when `direct` and the file system takes it (`direct`
// becomes false when it does not).
int open_maybe_direct(const std::string& path, int flags, bool& direct) {
  if (direct) {
    const int fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0600);
    if (fd >= 0 || errno != EINVAL) return fd;
    direct = false;
  }
  return ::open(path.c_str(), flags | O_CLOEXEC, 0600);
}

// Seconds to write `total` bytes of `buffer` (one chunk at a time) and fsync them.
double write_file(const std::string& path, const std::string& dir, const char* buffer, size_t chunk,
                  size_t total, bool& direct) {
  Fd f;
  f.fd = open_maybe_direct(path, O_WRONLY | O_CREAT | O_TRUNC, direct);
  if (f.fd < 0) throw Error(scratch_error(dir, "cannot create a file to measure the SSD"));
  Timer t;
  for (size_t done = 0; done < total; done += chunk)
    if (::write(f.fd, buffer, chunk) != static_cast<ssize_t>(chunk))
      throw Error(scratch_error(dir, str("cannot write ", bytes_text(static_cast<double>(total)),
                                         " to measure the SSD")));
  if (::fsync(f.fd) != 0) throw Error(scratch_error(dir, "cannot fsync the SSD test file"));
  const double seconds = t.seconds();
  if (!direct) ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
  return seconds;
}

double read_file(const std::string& path, const std::string& dir, char* buffer, size_t chunk,
                 size_t total, bool direct) {
  Fd f;
  f.fd = open_maybe_direct(path, O_RDONLY, direct);
  if (f.fd < 0) throw Error(scratch_error(dir, "cannot reopen the SSD test file"));
  if (!direct) ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
  Timer t;
  for (size_t done = 0; done < total; done += chunk)
    if (::read(f.fd, buffer, chunk) != static_cast<ssize_t>(chunk))
      throw Error(scratch_error(dir, "cannot read back the SSD test file"));
  return t.seconds();
}

}  // namespace

Result ssd_rate(const std::string& dir, const Sizes& sizes) {
  const size_t chunk = sizes.quick ? (size_t{1} << 20) : (size_t{8} << 20);
  const size_t total = sizes.quick ? (size_t{16} << 20) : (size_t{512} << 20);
  const int reps = sizes.quick ? 1 : 3;
  std::unique_ptr<char, decltype(&std::free)> buffer(
      static_cast<char*>(std::aligned_alloc(kAlign, chunk)), &std::free);
  PLAN_CHECK(buffer, "cannot allocate ", bytes_text(static_cast<double>(chunk)),
             " to measure the SSD");
  for (size_t i = 0; i < chunk; ++i) buffer.get()[i] = static_cast<char>(i * 131 + 7);
  RemoveFile file{
      (std::filesystem::path(dir) / str(".moe-plan-calibrate-", ::getpid(), ".tmp")).string()};
  bool direct = true;
  std::vector<double> writes, reads;
  for (int r = 0; r < reps; ++r) {
    writes.push_back(write_file(file.path, dir, buffer.get(), chunk, total, direct));
    reads.push_back(read_file(file.path, dir, buffer.get(), chunk, total, direct));
  }
  const double bytes = static_cast<double>(total);
  Result result;
  result.value = bytes / median(reads);
  result.notes.push_back(str("reads of a ", bytes_text(bytes), " file in ", dir, ", ",
                             bytes_text(static_cast<double>(chunk)), " a call, ",
                             direct ? "O_DIRECT" : "page cache dropped (no O_DIRECT here)",
                             ", median of ", reps));
  result.notes.push_back(str("writes (with fsync): ", rate_text(bytes / median(writes), "B/s")));
  return result;
}

}  // namespace moe::plan::measure
