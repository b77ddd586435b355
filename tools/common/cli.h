// What every moe tool shares: common flags, error/exit handling, provenance, progress lines
// (common/progress.h).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "common/progress.h"
#include "moe/comm/communicator.h"
#include "moe/device.h"
#include "moe/io/checkpoint.h"

namespace moe::tools {

struct CommonOptions {
  std::string tool;  // set by add_common_options (for -v's first line)
  int threads = 0;   // 0 = OpenMP default
  uint64_t seed = 1234;
  int verbose = 0;
  bool quiet = false;
};

// --version, --threads, --seed, --config, -v/--verbose, -q/--quiet.
void add_common_options(CLI::App& app, CommonOptions& options, const std::string& tool);
// Log level and thread count from the parsed options.
void apply_common_options(const CommonOptions& options);

// Number checks with plain messages ("--threads: must be >= 0, got -1").
CLI::Validator non_negative();
CLI::Validator positive();
// A finite number ("inf", "nan" and overflowing "1e999" refused). run_tool adds it to every
// floating-point flag of the tool, its subcommands and option groups, so no tool can forget it;
// the sign and range of each flag are its own check (and the library's, for configs).
CLI::Validator finite();
// Adds finite() to every floating-point option of `app` and of its subcommands and groups.
void require_finite_numbers(CLI::App& app);
// An integer its flag's type can hold (int64, or uint64 for `is_unsigned`), naming that range
// otherwise: CLI11 alone keeps the clamped result of an overflow (99999999999999999999 became
// 2^63 - 1) and the wrapped one of a negative unsigned (--seed -1 became 2^64 - 1). run_tool
// adds it to every integer flag, as finite() to every floating-point one. (A 32-bit flag's
// overflow below 2^63 is refused by CLI11's own conversion.)
CLI::Validator integer_in_range(bool is_unsigned);
void require_integers_in_range(CLI::App& app);
// The largest --threads accepted: 4 x the online CPUs, at least 16. More threads than that only
// oversubscribe (and OpenBLAS, given a million, spins in its start-up under a memory limit).
int max_threads();

// Who a tool's failure ends: its own process, or, for tools whose ranks work together under an
// MPI launcher (moe-train, moe-infer), the whole job.
enum class Scope { process, job };

// Parses and runs `body`; prints "moe-<tool>: error: ..." and returns the exit code: 0 success
// (and --help/--version: a tool without the common options gets --version here), 1 runtime
// error, 2 usage error. With Scope::job under an MPI launcher, a rank whose flags do not parse
// ends the whole job (MPI_Abort, exit code 2) instead of leaving the ranks that parsed theirs
// waiting for it in a collective, and the ranks agree whether to run at all: when some stopped
// after --help or --version, the others exit 2 too; errors of `body` are the tool's to end the
// job with (comm::abort_job).
int run_tool(const std::string& tool, CLI::App& app, int argc, char** argv,
             const std::function<int()>& body, Scope scope = Scope::process);

// Writes lines to stdout or a file ("-" = stdout); checks each line reached it. A write that
// fails (a full disk) throws moe::Error naming the file and the cause, and leaves no cut-short
// line: the file goes back to its last complete line, or is removed when it holds none; a file
// that the tool never wrote a line to is removed when the stream is destroyed unclosed (the tool
// failed), so no empty file passes for an output.
class OutputStream {
 public:
  // "-" is stdout. A file is truncated, or with `append` (a resumed run's metrics) extended, so
  // the lines of the run so far are never lost.
  explicit OutputStream(const std::string& path, bool append = false);
  ~OutputStream();
  void write_line(const std::string& line);
  void close();  // throws when the data did not all reach the file

 private:
  [[noreturn]] void fail(int error);

  std::string path_;
  std::FILE* file_ = nullptr;
  bool owned_ = false, append_ = false;
  long complete_ = 0;  // bytes of the file that end in a complete line
};

// SIGINT / SIGTERM set a flag instead of killing the process, so a long job can stop at a step
// boundary and save its state. A second signal kills as usual.
void install_stop_handler();
bool stop_requested();
int stop_signal();  // the signal received, 0 if none

// The device of --device `text`: "cpu", "cuda:N", or "cuda" = this rank's GPU (its rank among the
// ranks of `world` on its node, modulo the node's GPUs; GPU 0 without a world). Checked before any
// work: moe::Error "--device cuda: <why>" when no GPU is usable, or naming how many there are when
// N is out of range; UsageError for an unknown name. Makes the device current on this thread.
// Collective over `world` for "cuda" with more than one rank.
Device resolve_device(const std::string& text, comm::Communicator* world = nullptr);
// Adds --device (default "cpu") to `app` (or an option group); `what` ends the help text ("where
// the model trains").
CLI::Option* add_device_option(CLI::App& app, std::string& device, const std::string& what);
// Adds --read-weights and --verify-weights (how a checkpoint's weights are opened for inference:
// mapped by default, docs/FORMATS.md "Mapped weights"): `read` copies them into memory as
// before, `verify` checks every mapped chunk's checksum and every value before the first pass.
void add_weight_options(CLI::App& app, bool& read, bool& verify);

// Creates `dir` if needed and checks a file can be created in it, so that a run fails at start-up,
// not after hours of training, when its checkpoints could not be written.
void ensure_output_dir(const std::string& dir);

// Flushes stdout; returns 0, or 1 with "<tool>: error: ..." when the data did not all reach it.
int finish_stdout(const std::string& tool);
// Outputs given as flag -> path, where "-" is stdout: at most one of them may be "-", or their
// bytes would interleave there (an HDF5 image inside JSON lines). UsageError naming the flags.
void check_one_stdout(const std::vector<std::pair<std::string, std::string>>& outputs);

}  // namespace moe::tools
