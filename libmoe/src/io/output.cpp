// Output-path rules shared by every writer (see moe/io/output.h).
#include "moe/io/output.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "moe/error.h"
#include "moe/io/checkpoint_dir.h"
#include "moe/settings.h"

namespace moe::io {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

// The PID of a temporary name "<name>.tmp-<PID>" or "<name>.convert-<PID>" that a moe writer
// makes (<name> an HDF5 file, or the hidden name of the `last` link), or 0: files of other
// programs that happen to look alike are never touched.
long temporary_pid(const std::string& name) {
  for (const char* marker : {".tmp-", ".convert-"}) {
    const size_t at = name.rfind(marker);
    if (at == std::string::npos || at == 0) continue;
    const std::string base = name.substr(0, at);
    const bool ours = base == str(".", CheckpointDir::last_name(true)) ||
                      base == str(".", CheckpointDir::last_name(false)) ||
                      (base.size() > 3 && base.compare(base.size() - 3, 3, ".h5") == 0);
    if (!ours) continue;
    const std::string digits = name.substr(at + std::strlen(marker));
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      continue;
    return std::stol(digits);
  }
  return 0;
}

bool process_alive(long pid) {
  if (pid == static_cast<long>(::getpid())) return true;
  // EPERM: the process exists but belongs to someone else.
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

// A sharded checkpoint's directory (step-N/rank-R.h5) that a save never finished: it holds a
// temporary of a dead process (a rank was killed while writing; the save removed the directory
// before writing it, so every file in it is of that save), or nothing at all. One holding a
// live process's temporary is a save in progress.
bool interrupted_save(const std::filesystem::path& step_dir) {
  std::error_code ec;
  bool dead = false, empty = true;
  for (const std::filesystem::directory_entry& entry :
       std::filesystem::directory_iterator(step_dir, ec)) {
    empty = false;
    const long pid = temporary_pid(entry.path().filename().string());
    if (pid > 0 && process_alive(pid)) return false;
    dead |= pid > 0;
  }
  return !ec && (dead || empty);
}

}  // namespace

void check_replaceable(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw Error(str("cannot write '", path, "': ", std::strerror(errno)));
  }
  if (S_ISREG(st.st_mode)) return;
  // Writers put a temporary file in place with rename(), which would replace the node itself (a
  // device, a FIFO, a symbolic link) rather than write into it.
  throw Error(str("'", path, "' is ", kind_of(st.st_mode),
                  ", not a regular file: refusing to replace it (give the path of a new or "
                  "regular file)"));
}

namespace {

[[noreturn]] void refuse_existing(const std::string& path) {
  throw Error(str("'", path, "' already exists; remove it or pass ", flag_for(Setting::force),
                  " to replace it"));
}

}  // namespace

void check_output_file(const std::string& path, bool replace) {
  check_replaceable(path);
  std::error_code ec;
  if (!replace && std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
    refuse_existing(path);
}

void check_output_stream(const std::string& path, bool replace) {
  if (replace || path.empty() || path == "-") return;
  struct stat st {};
  // stat, not lstat: a stream follows a link and would truncate the regular file behind it.
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) refuse_existing(path);
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return removed;
  const fs::path last = fs::path(dir) / CheckpointDir::last_name(true);
  std::vector<fs::path> stale;  // collected first: removing while iterating is unspecified
  for (const fs::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    const long pid = temporary_pid(name);
    if (pid > 0 && !process_alive(pid)) stale.push_back(entry.path());
    std::error_code link;
    if (pid == 0 && CheckpointDir::is_step_name(name) && entry.is_directory(link) &&
        !fs::equivalent(last, entry.path(), link) && interrupted_save(entry.path()))
      stale.push_back(entry.path());
  }
  for (const fs::path& path : stale) {
    std::error_code rm;
    fs::remove_all(path, rm);
    if (!rm) removed.push_back(path.string());
  }
  return removed;
}

}  // namespace moe::io
