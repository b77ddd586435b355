#include "support/run.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "moe/error.h"

namespace moe::test {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  MOE_CHECK(out.good(), "cannot write ", path);
}

std::string under_limit(int64_t bytes, const std::string& command) {
  return (kAddressSanitizer ? std::string() : "ulimit -v " + std::to_string(bytes >> 10) + " && ") +
         command;
}

int64_t smallest_address_space(const std::string& command) {
  int64_t low = int64_t(16) << 20, high = int64_t(16) << 30;  // fails at low, runs at high
  MOE_CHECK(run_command(under_limit(high, command)).exit_code == 0, "'", command,
            "' fails under an address-space limit of 16 GB");
  while (high - low > (int64_t(4) << 20)) {
    const int64_t mid = low + (high - low) / 2;
    (run_command(under_limit(mid, "timeout -s KILL 10 " + command)).exit_code == 0 ? high : low) =
        mid;
  }
  return high;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

RunResult run_command(const std::string& command) {
  static int counter = 0;
  std::string base = std::filesystem::temp_directory_path().string() + "/moe-test-" +
                     std::to_string(::getpid()) + "-" + std::to_string(counter++);
  std::string full = "(" + command + ") >" + base + ".out 2>" + base + ".err </dev/null";
  int status = std::system(full.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(base + ".out");
  r.err = read_file(base + ".err");
  std::filesystem::remove(base + ".out");
  std::filesystem::remove(base + ".err");
  return r;
}

std::string tool_path(const std::string& tool) {
  const char* dir = std::getenv("MOE_BIN_DIR");
  return std::string(dir ? dir : MOE_TEST_BIN_DIR) + "/" + tool;
}

std::string tool(const std::string& name, const std::string& args) {
  return tool_path(name) + " " + args;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<std::string> fields(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string f; std::getline(in, f, '\t');) out.push_back(f);
  return out;
}

ScratchDir::ScratchDir(const std::string& name) {
  path_ = std::filesystem::temp_directory_path().string() + "/moe-scratch-" + name + "-" +
          std::to_string(::getpid());
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string fortunes_path(const std::string& name) {
  std::string path = "/usr/share/games/fortunes/" + name;
  MOE_CHECK(std::filesystem::exists(path), path,
            " is missing: install Debian's `fortunes` package (scripts/setup does)");
  return path;
}

std::string train_on_fortunes(const std::string& out_dir, const std::string& flags) {
  const RunResult r = run_command("timeout 300 " + tool_path("moe-train") + " --data " +
                                  fortunes_path("linux") + " --out " + out_dir + " " + flags);
  if (r.exit_code != 0)
    throw Error(str("moe-train into ", out_dir, " exited ", r.exit_code, ": ", r.err));
  return out_dir + "/last.h5";
}

}  // namespace moe::test
