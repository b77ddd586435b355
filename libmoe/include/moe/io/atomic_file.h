// The one way moe puts an output in place: write a temporary next to the target, fsync it, rename
// it over the target, fsync the directory. Readers (and a crash) see the old output or the whole
// new one, never a half-written file. Checkpoints, converted checkpoints, traces, safetensors,
// text files, sharded checkpoint directories and the trainer's `last` link all go through here.
#pragma once
#include <string>

namespace moe::io {

class AtomicFile {
 public:
  enum class Kind {
    file,       // temp "<path><marker><pid>", a regular file the caller writes (fopen, HDF5)
    directory,  // temp "<path>.tmp-<pid>/", created empty; the target directory is replaced whole
    link,       // temp "<dir>/.<name>.tmp-<pid>", a symbolic link made by link_to()
  };

  // Nothing is written yet. For a file, `path` must be new or a regular file
  // (check_replaceable: a rename would replace a device, FIFO or link rather than write into it),
  // checked before any work. A directory's temp is created here, emptied of any leftover.
  // `marker` names the temp of a file: ".tmp-" for final outputs, ".convert-" for the converter's
  // intermediate (both are recognised by remove_stale_temporaries).
  explicit AtomicFile(std::string path, Kind kind = Kind::file, const char* marker = ".tmp-");
  // Not committed: the temp is removed, the old target is untouched.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& path() const { return path_; }  // the target, as given
  const std::string& temp() const { return temp_; }  // where to write

  // Kind::link: the temp becomes a symbolic link to `target` (relative to the link's directory).
  void link_to(const std::string& target);

  // fsync the temp (not for a link), then rename it over the target. A directory target that
  // exists is moved aside first and put back when the rename fails. Throws moe::Error naming the
  // paths; the temp is removed then (the destructor does it), the old target kept.
  void commit();
  // fsync the target's directory so the rename survives a crash; a replaced directory's old copy
  // is removed afterwards. Separate from commit() because callers word this failure differently
  // ("saved ... but could not make the rename durable"): the new output is already in place.
  void sync_directory();
  // Removes the temp now (what the destructor does when commit() was never reached).
  void abandon() noexcept;

 private:
  std::string path_;    // as given (messages name it so)
  std::string target_;  // path_ without a trailing '/' (directories)
  std::string temp_;
  std::string aside_;  // the replaced directory, moved aside until sync_directory()
  Kind kind_;
  bool committed_ = false;
};

}  // namespace moe::io
