#include "cli.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <new>
#include <regex>
#include <thread>

#include "common/omp_wait.h"
#include "moe/cuda.h"
#ifdef MOE_HAVE_MPI
#include "moe/comm/mpi.h"
#endif
#include "moe/log.h"
#include "moe/tensor.h"
#include "moe/threads.h"
#include "moe/version.h"

namespace moe::tools {

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

bool has_flag(const CLI::App& app, const std::string& name) {
  return app.get_option_no_throw("--" + name) || app.get_option_no_throw(name);
}

// The nearest of `names` to `given` within a small edit distance, or "".
std::string nearest_name(const std::string& given, const std::vector<std::string>& names) {
  std::string nearest;
  size_t best = 3;
  for (const std::string& name : names)
    if (const size_t d = edit_distance(given, name); d < best) {
      best = d;
      nearest = name;
    }
  return nearest;
}

// The long flag names (without "--") `app` accepts: its own and its option groups'.
void long_names(const CLI::App& app, std::vector<std::string>& into) {
  for (const CLI::Option* opt : app.get_options())
    for (const std::string& name : opt->get_lnames()) into.push_back(name);
  for (const CLI::App* group : app.get_subcommands([](const CLI::App* sub) {
         return dynamic_cast<const CLI::Option_group*>(sub) != nullptr;
       }))
    long_names(*group, into);
}

// The subcommands of `app` a user can name (option groups are CLI11 subcommands too).
std::vector<const CLI::App*> subcommands_of(const CLI::App& app) {
  return app.get_subcommands(
      [](const CLI::App* sub) { return dynamic_cast<const CLI::Option_group*>(sub) == nullptr; });
}

// CLI11's TOML/INI reader, strict: a key may be spelt with underscores or dashes (d_model is
// --d-model), and a key or [section] that names no flag or subcommand is an error naming the
// nearest flag, where CLI11 would ignore it and train the default model.
class StrictConfig : public CLI::ConfigTOML {
 public:
  explicit StrictConfig(const CLI::App& app) : app_(app) {}

  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    std::vector<CLI::ConfigItem> items = CLI::ConfigTOML::from_config(input);
    for (CLI::ConfigItem& item : items) {
      if (item.name == "++" || item.name == "--") continue;  // CLI11's section markers
      std::replace(item.name.begin(), item.name.end(), '_', '-');
      const CLI::App* scope = &app_;
      for (const std::string& section : item.parents) {
        const CLI::App* sub = nullptr;
        for (const CLI::App* candidate : subcommands_of(*scope))
          if (candidate->get_name() == section) sub = candidate;
        if (!sub) throw CLI::ConfigError(str("--config: unknown section [", section, "]"));
        scope = sub;
      }
      if (has_flag(*scope, item.name)) continue;
      if (item.parents.empty()) {
        // A flat key of the subcommand given on the command line (`moe-infer score --config f`
        // or `moe-infer --config f score`: the file is read after the whole command line).
        const CLI::App* chosen = nullptr;
        for (const CLI::App* sub : app_.get_subcommands())
          if (has_flag(*sub, item.name)) chosen = sub;
        if (chosen) {
          item.parents = {chosen->get_name()};
          continue;
        }
        for (const CLI::App* sub : subcommands_of(app_))
          if (has_flag(*sub, item.name))
            throw CLI::ConfigError(str("--config: '", item.name, "' is a flag of the ",
                                       sub->get_name(), " subcommand, which this command does ",
                                       "not run"));
      }
      std::vector<std::string> names;
      long_names(*scope, names);
      const std::string nearest = nearest_name(item.name, names);
      throw CLI::ConfigError(
          str("--config: unknown key '", item.name, "'",
              nearest.empty() ? std::string() : str(" (did you mean '", nearest, "'?)")));
    }
    return items;
  }

 private:
  const CLI::App& app_;
};

// CLI11 reports a mistyped flag or subcommand as what it missed because of it ("--out is
// required", "A subcommand is required"); name the word that was not understood instead, with
// the nearest valid one. Empty when nothing was left over.
std::string unknown_words(const CLI::App& app) {
  const std::vector<std::string> left = app.remaining(true);
  std::vector<std::string> subcommands;
  for (const CLI::App* sub : subcommands_of(app)) subcommands.push_back(sub->get_name());
  if (!subcommands.empty() && app.get_subcommands().empty() && !left.empty() &&
      left[0].rfind('-', 0) != 0) {
    const std::string nearest = nearest_name(left[0], subcommands);
    std::string all;
    for (const std::string& name : subcommands) all += (all.empty() ? "" : ", ") + name;
    return str(
        "unknown subcommand '", left[0], "'",
        nearest.empty() ? str(" (one of ", all, ")") : str(" (did you mean ", nearest, "?)"));
  }
  std::vector<std::string> flags;
  long_names(app, flags);
  for (const CLI::App* sub : app.get_subcommands()) long_names(*sub, flags);
  for (const std::string& arg : left) {
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) continue;
    const std::string name =
        arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
    if (std::find(flags.begin(), flags.end(), name) != flags.end()) continue;
    if (!app.get_subcommands().empty())  // the subcommand run does not have it; another may
      for (const CLI::App* sub : subcommands_of(app))
        if (has_flag(*sub, name))
          return str("--", name, " is a flag of ", sub->get_name(), ", not of ",
                     app.get_subcommands().front()->get_name());
    const std::string nearest = nearest_name(name, flags);
    return str("unknown flag --", name,
               nearest.empty() ? std::string() : str(" (did you mean --", nearest, "?)"));
  }
  return {};
}

// A library error as the user reads it: the " [file.cpp:123]" places MOE_CHECK appends are for
// us, shown with -v only.
std::string for_user(const char* what) {
  if (log_level() >= LogLevel::debug) return what;
  static const std::regex place(R"( \[[^\[\]]+\.(cpp|h|cu|cuh):[0-9]+\])");
  return std::regex_replace(what, place, "");
}

// An allocation that failed (std::bad_alloc, alone or inside a library message), in words: what
// ran, and the flags of that command that make it need less memory.
std::string out_of_memory(const std::string& tool, const CLI::App& app) {
  const CLI::App* command = &app;
  while (!command->get_subcommands().empty()) command = command->get_subcommands().front();
  std::string ran = tool;
  if (command != &app) ran += " " + command->get_name();
  std::string smaller;
  for (const char* flag : {"--batch", "--micro-batch", "--seq", "--max-tokens", "--expert-budget",
                           "--host-budget", "--layers", "--d-model", "--experts"})
    if (command->get_option_no_throw(flag) != nullptr)
      smaller += (smaller.empty() ? "" : ", ") + std::string(flag);
  return str("out of memory while running '", ran,
             "': a memory allocation failed; give it more memory (ulimit -v, the container's "
             "limit)",
             smaller.empty() ? std::string() : str(", or make it smaller (", smaller, ")"));
}

// "moe-train 0.1.0 (git 1a2b3c4d5e6f)": what --version prints.
std::string version_text(const std::string& tool) {
  return tool + " " + moe::version() + " (git " + moe::git_revision() + ")";
}

}  // namespace

void add_common_options(CLI::App& app, CommonOptions& o, const std::string& tool) {
  o.tool = tool;
  app.set_version_flag("--version", version_text(tool));
  app.set_config("--config", "",
                 "Read flags from a TOML/INI file (key = value, keys as the flags without '--', "
                 "dashes or underscores; a [sub] section for a subcommand's flags); an unknown "
                 "key is an error");
  app.config_formatter(std::make_shared<StrictConfig>(app));
  app.add_option("--threads", o.threads,
                 str("CPU threads for BLAS and OpenMP (0 = all cores; at most ", max_threads(),
                     ", 4 x the online CPUs)"))
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            long long value = 0;
            if (!CLI::detail::lexical_cast(text, value)) return "not an integer: " + text;
            if (value < 0) return "must be >= 0, got " + text;
            if (value > max_threads())
              return str("at most ", max_threads(), " on this machine (4 x its ",
                         ::sysconf(_SC_NPROCESSORS_ONLN),
                         " online CPUs, and never fewer than 16), got ", text);
            return {};
          },
          "THREADS"));
  app.add_option("--seed", o.seed, "Seed of every random number (init, data order, router jitter)")
      ->capture_default_str();
  app.add_flag("-v,--verbose", o.verbose, "More log output (repeat for debug)");
  app.add_flag("-q,--quiet", o.quiet, "Only errors on stderr");
}

static CLI::Validator number_check(bool allow_zero, const char* name) {
  return CLI::Validator(
      [allow_zero](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "not a number: " + text;
        if (!std::isfinite(value)) return "must be a finite number, got " + text;
        if (value < 0 || (!allow_zero && value == 0))
          return std::string(allow_zero ? "must be >= 0" : "must be > 0") + ", got " + text;
        return {};
      },
      name);
}

CLI::Validator non_negative() { return number_check(true, "NONNEGATIVE"); }
CLI::Validator positive() { return number_check(false, "POSITIVE"); }

CLI::Validator finite() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "not a number: " + text;
        if (!std::isfinite(value)) return "must be a finite number, got " + text;
        return {};
      },
      "");  // no text in --help's type column
}

void require_finite_numbers(CLI::App& app) {
  for (CLI::Option* option : app.get_options())
    if (option->get_type_name().rfind("FLOAT", 0) == 0) option->check(finite());
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    require_finite_numbers(*sub);
}

CLI::Validator integer_in_range(bool is_unsigned) {
  return CLI::Validator(
      [is_unsigned](std::string& text) -> std::string {
        const char* begin = text.c_str();
        while (std::isspace(static_cast<unsigned char>(*begin))) ++begin;
        char* end = nullptr;
        errno = 0;
        // Base 0, as CLI11 converts (0x10 is 16). strtoull takes "-1" for 2^64 - 1.
        bool wrapped = false;
        if (is_unsigned)
          wrapped = std::strtoull(begin, &end, 0) != 0 && *begin == '-';
        else
          std::strtoll(begin, &end, 0);
        if (end == begin || *end != '\0') return {};  // not an integer: the conversion says so
        if (errno != ERANGE && !wrapped) return {};
        if (is_unsigned)
          return str("must be an integer in 0..", std::numeric_limits<uint64_t>::max(), ", got ",
                     text);
        return str("must be an integer in ", std::numeric_limits<int64_t>::min(), "..",
                   std::numeric_limits<int64_t>::max(), ", got ", text);
      },
      "");  // no text in --help's type column
}

void require_integers_in_range(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0)
      option->check(integer_in_range(type[0] == 'U'));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    require_integers_in_range(*sub);
}

int max_threads() {
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  return static_cast<int>(std::max(16L, 4 * std::max(1L, online)));
}

int finish_stdout(const std::string& tool) {
  std::fflush(stdout);
  if (std::ferror(stdout)) {
    std::fprintf(stderr, "%s: error: writing stdout failed\n", tool.c_str());
    return 1;
  }
  return 0;
}

void apply_common_options(const CommonOptions& o) {
  if (o.quiet)
    set_log_level(LogLevel::error);
  else if (o.verbose > 0)
    set_log_level(LogLevel::debug);
  if (o.threads > 0) set_num_threads(o.threads);
  // -v: what is running, on what (then the library's debug lines: files read and written, ...).
  MOE_LOG_DEBUG(version_text(o.tool.empty() ? "moe" : o.tool), ": ", num_threads(), " threads of ",
                std::thread::hardware_concurrency(), " CPUs; idle threads wait by ",
                omp_wait_text());
}

namespace {

// Under an MPI launcher the ranks of a job agree whether to run (collective): a rank that stopped
// after --help or --version would leave the others waiting for it forever in their first
// collective. True, with a message, on a rank that would have run while another stopped.
bool other_ranks_stopped_early(const std::string& tool, bool stopped) {
#ifdef MOE_HAVE_MPI
  if (!comm::launched_under_mpi()) return false;
  std::unique_ptr<comm::Communicator> world = comm::make_mpi_world();
  if (world->size() == 1) return false;
  Tensor count = Tensor::empty({1}, DType::i32);
  count.data<int32_t>()[0] = stopped ? 1 : 0;
  world->all_reduce(count, comm::ReduceOp::sum);
  const int stopped_ranks = count.data<int32_t>()[0];
  if (stopped || stopped_ranks == 0) return false;
  std::fprintf(stderr,
               "%s: error: %d of the job's %d ranks stopped after --help or --version; give every "
               "rank the same flags\n",
               tool.c_str(), stopped_ranks, world->size());
  return true;
#else
  (void)tool;
  (void)stopped;
  return false;
#endif
}

}  // namespace

int run_tool(const std::string& tool, CLI::App& app, int argc, char** argv,
             const std::function<int()>& body, Scope scope) {
  require_finite_numbers(app);
  require_integers_in_range(app);
  // Every tool and benchmark answers --version, whether or not it took the common options.
  if (app.get_option_no_throw("--version") == nullptr)
    app.set_version_flag("--version", version_text(tool));
  int early_exit = -1;  // the exit code of --help or --version; -1: the tool runs
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    early_exit = app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    early_exit = app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    early_exit = app.exit(e);
  } catch (const CLI::ParseError& parse_error) {
    const std::string unknown = unknown_words(app);
    const std::string what = unknown.empty() ? parse_error.what() : unknown;
#ifdef MOE_HAVE_MPI
    // The other ranks may have parsed their flags and be waiting in MPI_Init or a collective:
    // join MPI (MPI_Abort needs it) and end the job, as a rank failing later would.
    if (scope == Scope::job && comm::launched_under_mpi()) {
      std::unique_ptr<comm::Communicator> world = comm::make_mpi_world();
      if (world->size() > 1)
        comm::abort_job(str(tool, ": error: ", what, " (run '", tool, " --help' for the flags)"),
                        2);
    }
#else
    (void)scope;
#endif
    std::fprintf(stderr, "%s: error: %s\nRun '%s --help' for the flags.\n", tool.c_str(),
                 what.c_str(), tool.c_str());
    return 2;
  }
  if (scope == Scope::job && other_ranks_stopped_early(tool, early_exit >= 0)) return 2;
  if (early_exit >= 0) return early_exit;
  try {
    return body();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), out_of_memory(tool, app).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::string what = for_user(e.what());
    // A library message around a failed allocation ("loading 'x': std::bad_alloc").
    const size_t bad_alloc = what.find("std::bad_alloc");
    if (bad_alloc != std::string::npos)
      what.replace(bad_alloc, std::string("std::bad_alloc").size(), out_of_memory(tool, app));
    std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), what.c_str());
    return 1;
  }
}

OutputStream::OutputStream(const std::string& path, bool append) : path_(path), append_(append) {
  if (path == "-") {
    file_ = stdout;
  } else {
    file_ = std::fopen(path.c_str(), append ? "a" : "w");
    if (!file_) throw Error(str("cannot open '", path, "' for writing: ", std::strerror(errno)));
    owned_ = true;
    if (append && std::fseek(file_, 0, SEEK_END) == 0) complete_ = std::ftell(file_);
  }
}

OutputStream::~OutputStream() {
  if (!owned_ || !file_) return;
  std::fclose(file_);
  // The tool failed before writing a line: an empty file would pass for a complete output.
  if (!append_ && complete_ == 0) ::unlink(path_.c_str());
}

void OutputStream::write_line(const std::string& line) {
  errno = 0;
  if (std::fputs(line.c_str(), file_) < 0 || std::fputc('\n', file_) == EOF ||
      std::fflush(file_) != 0)
    fail(errno);
  complete_ += static_cast<long>(line.size()) + 1;
}

void OutputStream::close() {
  if (!file_) return;
  errno = 0;
  const bool flushed = std::fflush(file_) == 0 && !std::ferror(file_);
  int error = flushed ? 0 : errno;
  if (owned_ && std::fclose(file_) != 0 && flushed) error = errno;
  const bool failed = !flushed || error != 0;
  file_ = nullptr;
  if (failed) fail(error);
}

void OutputStream::fail(int error) {
  const std::string cause = std::strerror(error ? error : EIO);
  if (!owned_) throw Error(str("writing stdout failed: ", cause));
  if (file_) std::fclose(file_);
  file_ = nullptr;
  // No cut-short line and no empty file stays behind: the file goes back to its last complete
  // line (what a resumed run's metrics held before, when appending), or away when it had none.
  std::string fate = "; removed it";
  if (append_ || complete_ > 0) {
    fate = str("; kept its complete lines (", complete_, " bytes)");
    if (::truncate(path_.c_str(), complete_) != 0) fate = "; it may end in a cut-short line";
  } else if (::unlink(path_.c_str()) != 0) {
    fate = "; it may be empty";
  }
  throw Error(str("writing '", path_, "' failed: ", cause, fate));
}

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
  std::signal(sig, SIG_DFL);  // a second signal ends the process
}
}  // namespace

void install_stop_handler() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}
bool stop_requested() { return g_stop_signal != 0; }
int stop_signal() { return g_stop_signal; }

Device resolve_device(const std::string& text, comm::Communicator* world) {
  Device device = Device::parse(text);
  if (device.kind == Device::cpu) return device;
  if (!cuda::available()) throw Error(str("--device ", text, ": ", cuda::unavailable_reason()));
  if (text == "cuda" && world && world->size() > 1) {
    std::unique_ptr<comm::Communicator> node = world->split_node();
    device.index = cuda::device_for_local_rank(node->rank());
  }
  const int count = cuda::device_count();
  if (device.index < 0 || device.index >= count)
    throw Error(str("--device ", text, ": this machine has ", count, " CUDA device",
                    count == 1 ? "" : "s", " (cuda:0 .. cuda:", count - 1, ")"));
  cuda::set_device(device.index);
  return device;
}

CLI::Option* add_device_option(CLI::App& app, std::string& device, const std::string& what) {
  return app
      .add_option("--device", device,
                  "cpu, cuda (under mpiexec: each rank's own GPU on its node) or cuda:N: " + what +
                      "; files written are the same as on the CPU")
      ->capture_default_str();
}

void add_weight_options(CLI::App& app, bool& read, bool& verify) {
  app.add_flag("--read-weights", read,
               "Read the weights into memory instead of mapping them from the checkpoint (a "
               "mapped model opens at once, shares the page cache between processes and holds "
               "only the pages it touches)");
  app.add_flag("--verify-weights", verify,
               "Before the first pass, check every mapped weight's checksum and values (reads "
               "the whole file once); weights read into memory are always checked");
}

void ensure_output_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw Error(str("output directory '", dir, "': ", ec ? ec.message() : "not a directory"));
  fs::path probe = fs::path(dir) / (".moe-write-test-" + std::to_string(::getpid()));
  std::FILE* f = std::fopen(probe.c_str(), "w");
  if (!f) throw Error(str("output directory '", dir, "' is not writable: ", std::strerror(errno)));
  std::fclose(f);
  fs::remove(probe, ec);
}

void check_one_stdout(const std::vector<std::pair<std::string, std::string>>& outputs) {
  std::vector<std::string> to_stdout;
  for (const auto& [flag, path] : outputs)
    if (path == "-") to_stdout.push_back(flag + " -");
  if (to_stdout.size() < 2) return;
  std::string listed;
  for (size_t i = 0; i < to_stdout.size(); ++i)
    listed += (i == 0 ? "" : i + 1 == to_stdout.size() ? " and " : ", ") + to_stdout[i];
  throw UsageError(str(listed, " would all write to stdout, mixing their bytes: send all but one ",
                       "of them to a file"));
}

}  // namespace moe::tools
