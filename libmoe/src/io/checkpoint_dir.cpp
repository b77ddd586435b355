// Checkpoint names, the `last` link, discovery and resolution (see moe/io/checkpoint_dir.h).
#include "moe/io/checkpoint_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "moe/error.h"
#include "moe/io/atomic_file.h"

namespace moe::io {

namespace fs = std::filesystem;

std::string CheckpointDir::step_name(int64_t step, bool sharded) {
  char name[32];
  std::snprintf(name, sizeof name, sharded ? "step-%08lld" : "step-%08lld.h5",
                static_cast<long long>(step));
  return name;
}

const char* CheckpointDir::last_name(bool sharded) { return sharded ? "last" : "last.h5"; }

bool CheckpointDir::is_step_name(const std::string& name) {
  if (name.rfind("step-", 0) != 0) return false;
  std::string digits = name.substr(5);
  if (digits.size() >= 3 && digits.compare(digits.size() - 3, 3, ".h5") == 0)
    digits.resize(digits.size() - 3);
  return digits.size() == 8 && digits.find_first_not_of("0123456789") == std::string::npos;
}

std::string CheckpointDir::rank_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05d.h5", rank);
  return name;
}

std::string CheckpointDir::rank_file(const std::string& sharded_dir, int rank) {
  return (fs::path(sharded_dir) / rank_file_name(rank)).string();
}

int CheckpointDir::rank_of_file_name(const std::string& name) {
  if (name.size() != 13 || name.rfind("rank-", 0) != 0 || name.substr(10) != ".h5") return -1;
  int rank = 0;
  for (size_t i = 5; i < 10; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    rank = rank * 10 + (name[i] - '0');
  }
  return rank;
}

std::string CheckpointDir::step(int64_t step, bool sharded) const {
  return (fs::path(dir_) / step_name(step, sharded)).string();
}

std::string CheckpointDir::last(bool sharded) const {
  return (fs::path(dir_) / last_name(sharded)).string();
}

void CheckpointDir::point_last(int64_t step, bool sharded) const {
  // A symbolic link made under a hidden temporary name, then renamed over the old one.
  AtomicFile link(last(sharded), AtomicFile::Kind::link);
  link.link_to(step_name(step, sharded));
  link.commit();
  // A run resumed on another layout switches between last.h5 and last: the other link would
  // still name an older step, and resolve_checkpoint would have to guess which is the newest.
  std::error_code ec;
  fs::remove(last(!sharded), ec);
  if (ec) throw Error(str("cannot remove the stale link '", last(!sharded), "': ", ec.message()));
}

std::vector<std::string> CheckpointDir::checkpoints() const {
  std::vector<std::string> found;
  std::error_code ec;
  fs::directory_iterator it(dir_, ec);
  if (ec) return found;
  for (const fs::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name == last_name(false) || name == last_name(true) || is_step_name(name))
      found.push_back(name);
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<std::string> checkpoint_files(const std::vector<std::string>& paths) {
  MOE_USAGE_CHECK(!paths.empty(), "no checkpoint given");
  std::vector<std::string> files;
  if (paths.size() > 1) {
    for (const std::string& p : paths) {
      std::error_code ec;
      if (!fs::exists(p, ec)) throw Error(str("'", p, "': no such file or directory"));
      MOE_USAGE_CHECK(!fs::is_directory(p, ec), "'", p,
                      "' is a directory: give one sharded checkpoint directory, or rank files");
      files.push_back(p);
    }
    return files;
  }
  const CheckpointRef ref = resolve_checkpoint(paths[0]);
  if (!ref.sharded) return {ref.path};
  std::error_code ec;
  std::vector<std::pair<int, std::string>> ranks;
  for (const fs::directory_entry& entry : fs::directory_iterator(ref.path, ec)) {
    const int r = CheckpointDir::rank_of_file_name(entry.path().filename().string());
    if (r >= 0) ranks.emplace_back(r, entry.path().string());
  }
  if (ec) throw Error(str("cannot list '", ref.path, "': ", ec.message()));
  std::sort(ranks.begin(), ranks.end());
  for (auto& [r, f] : ranks) files.push_back(f);
  return files;
}

CheckpointRef resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(str("'", path, "': no such file or directory"));
  if (!fs::is_directory(path, ec)) return {path, false};
  for (const fs::directory_entry& entry : fs::directory_iterator(path, ec))
    if (CheckpointDir::rank_of_file_name(entry.path().filename().string()) >= 0)
      return {path, true};
  if (ec) throw Error(str("cannot list '", path, "': ", ec.message()));
  const std::string last_dir = CheckpointDir(path).last(true);
  const std::string last_file = CheckpointDir(path).last(false);
  const bool dir = fs::is_directory(last_dir, ec), file = fs::is_regular_file(last_file, ec);
  // Both only after a crash between point_last's rename and its removal of the other link (or
  // from an earlier build): the newer step wins, whichever layout wrote it.
  if (dir && file &&
      fs::read_symlink(last_file, ec).filename().string().substr(0, 13) >
          fs::read_symlink(last_dir, ec).filename().string())
    return {last_file, false};
  if (dir) return resolve_checkpoint(last_dir);
  if (file) return {last_file, false};
  throw Error(str("'", path,
                  "' holds no checkpoint: no rank-<5 digits>.h5 files (a sharded checkpoint), "
                  "no 'last' directory or 'last.h5' (a moe-train output directory)"));
}

}  // namespace moe::io
