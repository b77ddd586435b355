// One run per output directory (see moe/train/run_dir.h).
#include "moe/train/run_dir.h"

#include <algorithm>
#include <filesystem>

#include "moe/error.h"

namespace moe::train {

namespace fs = std::filesystem;

namespace {

bool is_step_name(const std::string& name) {
  // step-<8 digits>.h5 (one file) or step-<8 digits> (a sharded checkpoint's directory).
  if (name.rfind("step-", 0) != 0) return false;
  std::string digits = name.substr(5);
  if (digits.size() >= 3 && digits.compare(digits.size() - 3, 3, ".h5") == 0)
    digits.resize(digits.size() - 3);
  return digits.size() == 8 && digits.find_first_not_of("0123456789") == std::string::npos;
}

// The directory a checkpoint path lives in, made absolute and normal ("" when it has none).
fs::path resolved(const fs::path& path) {
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? fs::absolute(path).lexically_normal() : canonical;
}

}  // namespace

std::vector<std::string> run_checkpoints(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return found;
  for (const fs::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name == "last.h5" || name == "last" || is_step_name(name)) found.push_back(name);
  }
  std::sort(found.begin(), found.end());
  return found;
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
  const bool sharded = std::find(held.begin(), held.end(), "last") != held.end() &&
                       std::find(held.begin(), held.end(), "last.h5") == held.end();
  const std::string last = (fs::path(dir) / (sharded ? "last" : "last.h5")).string();
  std::string listed;
  for (size_t i = 0; i < held.size() && i < 3; ++i) listed += (i ? ", " : "") + held[i];
  if (held.size() > 3) listed += str(", ... (", held.size(), " in all)");
  throw Error(str("output directory '", dir, "' holds the checkpoints of another run (", listed,
                  ")", resume.empty() ? "" : str(", not of the run in '", resume, "'"), ": ",
                  resumable ? str("continue that run with --resume ", last, ", ") : "",
                  "choose another --out, or pass --force to write beside them"));
}

}  // namespace moe::train
