// Test helpers for running the tools as a user would, and for scratch directories and corpora.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace moe::test {

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs `command` through /bin/sh, capturing stdout and stderr.
RunResult run_command(const std::string& command);
// Path of a built tool ("moe-train"), from MOE_BIN_DIR.
std::string tool_path(const std::string& tool);
// The command line running tool `name` with `args` (a string for run_command).
std::string tool(const std::string& name, const std::string& args);
// The lines of a tool's output, and the tab-separated fields of one line.
std::vector<std::string> lines_of(const std::string& text);
std::vector<std::string> fields(const std::string& line);
// A fresh empty directory under the build tree, removed when the object dies.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name);
  ~ScratchDir();
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& file) const { return path_ + "/" + file; }
  std::string file(const std::string& name) const { return *this / name; }

 private:
  std::string path_;
};
// A real English text from Debian's `fortunes` package (`name` is a file of
// /usr/share/games/fortunes); fails the test clearly when the package is missing.
std::string fortunes_path(const std::string& name = "computers");
// Trains with moe-train on fortunes_path("linux") into `out_dir` with `flags` (the model and the
// run), as the CLI fixtures do; returns out_dir/last.h5. A run that fails (or hangs past 300 s)
// throws moe::Error with its exit status and stderr.
std::string train_on_fortunes(const std::string& out_dir, const std::string& flags);
// The smallest model the CLI tests train, in moe-train's default flavour (gpt): 2 layers of 4
// experts, d_model 16, 1 thread, quiet; add --steps (and --arch).
inline const std::string kTinyModel =
    " --layers 2 --d-model 16 --heads 2 --d-ff 32 --seq 16 --experts 4 --moe-every 1 --batch 4"
    " --eval-batches 1 --threads 1 -q";
// The same as a mixtral, with grouped-query attention; add --steps.
inline const std::string kTinyMixtral = " --arch mixtral --kv-heads 1" + kTinyModel;
// AddressSanitizer reserves terabytes of shadow address space at start: a tool built with it
// cannot start under `ulimit -v`, so tests that prove bounded memory skip the limit there.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
// `command` under an address-space limit (RLIMIT_AS, `ulimit -v`) of `bytes`; no limit under
// AddressSanitizer.
std::string under_limit(int64_t bytes, const std::string& command);
// The smallest address-space limit (to 4 MB, between 16 MB and 16 GB) under which `command` exits
// 0: what a tool maps to start and do a small job, on this build and machine. A limit just short
// of what the tool needs can leave a library spinning on an allocation it cannot get: such a
// probe is stopped after 10 s and counts as too small.
int64_t smallest_address_space(const std::string& command);
std::string read_file(const std::string& path);
// The message of the moe::Error that `f` throws, or "(no error)".
std::string error_of(const std::function<void()>& f);
void write_file(const std::string& path, const std::string& bytes);

}  // namespace moe::test
