// One run per output directory (see moe/train/run_dir.h).
#include "moe/train/run_dir.h"

#include <algorithm>
#include <filesystem>

#include "moe/error.h"
#include "moe/io/checkpoint_dir.h"
#include "moe/settings.h"

namespace moe::train {

namespace fs = std::filesystem;

namespace {

// The directory a checkpoint path lives in, made absolute and normal ("" when it has none).
fs::path resolved(const fs::path& path) {
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? fs::absolute(path).lexically_normal() : canonical;
}

}  // namespace

std::vector<std::string> run_checkpoints(const std::string& dir) {
  return io::CheckpointDir(dir).checkpoints();
}

void check_run_directory(const std::string& dir, const std::string& resume, bool force,
                         bool resumable) {
  if (force) return;
  const std::vector<std::string> held = run_checkpoints(dir);
  if (held.empty()) return;
  const fs::path out = resolved(dir);
  if (!resume.empty()) {
    // The checkpoint's own directory: for last.h5 -> step-N.h5 (a link) the link's directory, not
    // its target's, so weakly_canonical is applied to the parent only.
    fs::path given(resume);
    if (given.filename().empty()) given = given.parent_path();  // "DIR/step-N/" -> "DIR/step-N"
    const fs::path parent = given.has_parent_path() ? given.parent_path() : fs::path(".");
    if (resolved(parent) == out) return;  // resuming this directory's own run
  }
  auto holds = [&](const char* name) {
    return std::find(held.begin(), held.end(), name) != held.end();
  };
  const bool sharded =
      holds(io::CheckpointDir::last_name(true)) && !holds(io::CheckpointDir::last_name(false));
  const std::string last = io::CheckpointDir(dir).last(sharded);
  std::string listed;
  for (size_t i = 0; i < held.size() && i < 3; ++i) listed += (i ? ", " : "") + held[i];
  if (held.size() > 3) listed += str(", ... (", held.size(), " in all)");
  throw Error(str(
      "output directory '", dir, "' holds the checkpoints of another run (", listed, ")",
      resume.empty() ? "" : str(", not of the run in '", resume, "'"), ": ",
      resumable ? str("continue that run with ", flag_for(Setting::resume), " ", last, ", ") : "",
      "choose another ", flag_for(Setting::out), ", or pass ", flag_for(Setting::force),
      " to write beside them"));
}

}  // namespace moe::train
