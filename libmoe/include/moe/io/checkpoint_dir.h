// Where checkpoints live on disk, spelled once. A training run's output directory holds
//   DIR/step-<8 digits>.h5              one checkpoint file per saved step, or, sharded,
//   DIR/step-<8 digits>/rank-<5 digits>.h5   one file per rank that owns tensors
//   DIR/last.h5 (DIR/last when sharded) a relative symbolic link to the newest step
// The link moves atomically (AtomicFile), so a crash leaves it at the previous step or the new one.
// Readers (moe-convert, verify, resume) accept a run directory, a checkpoint file or a sharded
// directory; checkpoint_files() turns any of them into files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moe::io {

class CheckpointDir {
 public:
  explicit CheckpointDir(std::string dir) : dir_(std::move(dir)) {}
  const std::string& path() const { return dir_; }

  // DIR/step-<8 digits>.h5, or the directory DIR/step-<8 digits> of a sharded checkpoint.
  std::string step(int64_t step, bool sharded = false) const;
  // DIR/last.h5, or DIR/last when sharded.
  std::string last(bool sharded = false) const;
  // Points last.h5 (last) at step's checkpoint and removes the other form's link, so a run that
  // changed layout (one file <-> a sharded directory) has one `last`; the link is relative, so
  // the run directory can move. Throws moe::Error naming the link.
  void point_last(int64_t step, bool sharded = false) const;
  // The checkpoint names found in DIR (last.h5, last, step-<8 digits>.h5, step-<8 digits>),
  // sorted; empty when DIR is missing or holds none.
  std::vector<std::string> checkpoints() const;

  static std::string step_name(int64_t step, bool sharded = false);  // "step-00000012[.h5]"
  static const char* last_name(bool sharded = false);                // "last.h5" or "last"
  // step-<8 digits>.h5 or step-<8 digits>.
  static bool is_step_name(const std::string& name);
  // The file of `rank` in a sharded checkpoint: "rank-00003.h5", and that file in `sharded_dir`.
  static std::string rank_file_name(int rank);
  static std::string rank_file(const std::string& sharded_dir, int rank);
  // "rank-<5 digits>.h5" -> the rank, else -1.
  static int rank_of_file_name(const std::string& name);

 private:
  std::string dir_;
};

// The checkpoint a user names where one is read (moe-infer --model, moe-distill --teacher,
// moe-profile record --model, moe-train --resume, moe-convert): a checkpoint file as given; a
// sharded checkpoint directory (rank-<5 digits>.h5 files), `sharded`; or a moe-train output
// directory, resolved to its newest checkpoint (DIR/last.h5, or the sharded DIR/last; when both
// are there, the one naming the later step). Throws
// moe::Error naming a missing path, or a directory that holds no checkpoint and what was looked
// for.
struct CheckpointRef {
  std::string path;  // the checkpoint file, or the sharded checkpoint's directory
  bool sharded = false;
};
CheckpointRef resolve_checkpoint(const std::string& path);

// The files of the checkpoint named by `paths`: one checkpoint file; a sharded checkpoint
// directory (its rank-<5 digits>.h5 files, in rank order; temporary *.tmp-* files are ignored); a
// training output directory (its `last` directory or `last.h5` file, followed); or several rank
// files. Throws naming a missing path or a directory that holds no checkpoint; several paths must
// all be files (UsageError otherwise).
std::vector<std::string> checkpoint_files(const std::vector<std::string>& paths);

}  // namespace moe::io
