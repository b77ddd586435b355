// Temp, fsync, rename, directory fsync (see moe/io/atomic_file.h).
#include "moe/io/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "io/files.h"
#include "moe/error.h"
#include "moe/io/output.h"

namespace moe::io {

namespace fs = std::filesystem;

namespace {

// rename(temp, path) after check_replaceable(path): checked again at the last moment, because
// the target may have been replaced by a device, FIFO or link while the temp was being written.
void rename_into_place(const std::string& temp, const std::string& path) {
  check_replaceable(path);
  if (std::rename(temp.c_str(), path.c_str()) != 0)
    throw Error(str("cannot rename '", temp, "' to '", path, "': ", std::strerror(errno)));
}

}  // namespace

AtomicFile::AtomicFile(std::string path, Kind kind, const char* marker)
    : path_(std::move(path)), target_(path_), kind_(kind) {
  // "-" means stdout to every tool; an output that must appear whole or not at all cannot go
  // there, and a file literally named "-" is never what was meant (./- names one).
  if (kind_ != Kind::link && path_ == "-")
    throw UsageError(
        "'-' (stdout) cannot take this output: it is written as a file that appears whole or not "
        "at all; name a file (./- for one called '-')");
  const long pid = static_cast<long>(::getpid());
  switch (kind_) {
    case Kind::file:
      check_replaceable(path_);  // before the work: never rename over a device, FIFO or link
      temp_ = str(path_, marker, pid);
      break;
    case Kind::directory: {
      fs::path target(path_);
      if (target.filename().empty()) target = target.parent_path();  // "out/" -> "out"
      target_ = target.string();
      temp_ = str(target_, ".tmp-", pid);
      aside_ = str(target_, ".old-", pid);
      std::error_code ec;
      fs::remove_all(temp_, ec);  // a leftover of an earlier process with our pid
      fs::create_directories(temp_, ec);
      if (ec) throw Error(str("cannot create '", temp_, "': ", ec.message()));
      break;
    }
    case Kind::link: {
      // Hidden, so that a directory listing never shows a half-made `last`.
      const fs::path target(path_);
      temp_ = (target.parent_path() / str(".", target.filename().string(), ".tmp-", pid)).string();
      break;
    }
  }
}

AtomicFile::~AtomicFile() {
  if (!committed_) abandon();
}

void AtomicFile::abandon() noexcept {
  std::error_code ignored;
  if (kind_ == Kind::directory)
    fs::remove_all(temp_, ignored);
  else
    fs::remove(temp_, ignored);
}

void AtomicFile::link_to(const std::string& target) {
  MOE_CHECK(kind_ == Kind::link, "AtomicFile::link_to on '", path_, "', which is not a link");
  std::error_code ec;
  fs::remove(temp_, ec);
  fs::create_symlink(target, temp_, ec);
  if (ec) throw Error(str("cannot create link '", temp_, "': ", ec.message()));
}

void AtomicFile::commit() {
  MOE_CHECK(!committed_, "AtomicFile: '", path_, "' committed twice");
  std::error_code ec;
  switch (kind_) {
    case Kind::file:
      fsync_path(temp_, false);
      rename_into_place(temp_, path_);
      break;
    case Kind::directory: {
      fsync_path(temp_, true);
      const bool exists = fs::exists(fs::symlink_status(target_, ec));
      if (exists) {
        fs::rename(target_, aside_, ec);
        if (ec) throw Error(str("cannot move '", path_, "' aside: ", ec.message()));
      } else {
        aside_.clear();
      }
      fs::rename(temp_, target_, ec);
      if (ec) {
        std::error_code ignored;
        if (exists) fs::rename(aside_, target_, ignored);
        throw Error(str("cannot rename '", temp_, "' to '", path_, "': ", ec.message()));
      }
      break;
    }
    case Kind::link:
      // A link may replace a link: no check_replaceable, and nothing to fsync.
      fs::rename(temp_, path_, ec);
      if (ec) throw Error(str("cannot update '", path_, "': ", ec.message()));
      break;
  }
  committed_ = true;
}

void AtomicFile::sync_directory() {
  fsync_path(parent_directory(target_), true);
  if (kind_ == Kind::directory && !aside_.empty()) {
    std::error_code ec;
    fs::remove_all(aside_, ec);
  }
}

}  // namespace moe::io
