// Messages in the user's words (issue 45, item 11): a failed HDF5 call, a JSON file that does not
// parse or holds a value of the wrong type, a directory given as an input file, a failed
// allocation. Each error names the file and says what went wrong in words; none carries the C++
// text of a library call, nlohmann's exception tags or a bare std::bad_alloc.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

// What a message must never hold: HDF5 call text (H5Fcreate(path.c_str(), ...)), nlohmann's
// "[json.exception.parse_error.101]", C++ names.
const std::vector<std::string> kInternals = {
    "json.exception", "H5", "std::", "bad_alloc", "c_str", "split_tail"};

void expect_words(const test::RunResult& r, const std::string& tool_name,
                  const std::vector<std::string>& words) {
  INFO(r.err);
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.rfind(tool_name + ": error: ", 0) == 0);
  for (const std::string& w : words) REQUIRE(r.err.find(w) != std::string::npos);
  for (const std::string& bad : kInternals) REQUIRE(r.err.find(bad) == std::string::npos);
}

struct Trained {
  test::ScratchDir dir{"cli-user-messages"};
  std::string ckpt, trace, table;
  Trained() {
    ckpt = test::train_on_fortunes(dir / "run", test::kTinyMixtral + " --steps 2");
    trace = dir / "trace.h5";
    table = dir / "paths.json";
    const std::string data = test::fortunes_path("linux");
    for (const std::string& command :
         {tool("moe-profile",
               "record -q --model " + ckpt + " --data " + data + " --max-tokens 2000 -o " + trace),
          tool("moe-profile", "paths -q " + trace + " -o " + table)}) {
      const test::RunResult r = run_command(command);
      INFO(command << "\n" << r.err);
      REQUIRE(r.exit_code == 0);
    }
  }
};

Trained& trained() {
  static Trained t;
  return t;
}

struct Case {
  std::string name, tool, args;
  std::vector<std::string> words;
};

void run_cases(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    INFO(c.name << ": " << c.tool << " " << c.args);
    expect_words(run_command("timeout 60 " + tool(c.tool, c.args)), c.tool, c.words);
  }
}

}  // namespace

TEST_CASE("cli: HDF5 failures are told in words, naming the file", "[cli][messages]") {
  // Before: "'out/x.h5.tmp-123' /: H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, fapl) failed:
  // unable to create file; unable to open file: time = ..., tent_flags = 13; ...".
  Trained& t = trained();
  test::ScratchDir dir("cli-user-messages-hdf5");
  const std::string absent = dir / "absent";
  test::write_file(dir / "plain", "a file, not a directory\n");
  run_cases({
      {"freeze into a missing directory",
       "moe-convert",
       "freeze " + t.ckpt + " -o " + absent + "/x.h5",
       {"cannot create '" + absent + "/x.h5'", "directory '" + absent + "' does not exist"}},
      {"trace into a missing directory",
       "moe-profile",
       "record -q --model " + t.ckpt + " --data " + test::fortunes_path("linux") + " -o " + absent +
           "/t.h5",
       {"cannot create '" + absent + "/t.h5'", "directory '" + absent + "' does not exist"}},
      {"a file where the directory should be",
       "moe-convert",
       "freeze " + t.ckpt + " -o " + (dir / "plain") + "/x.h5",
       {dir / "plain", "ot a directory"}},
  });
  if (::geteuid() != 0) {  // root writes anywhere
    const std::string locked = dir / "locked";
    fs::create_directory(locked);
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
    run_cases({{"freeze into a read-only directory",
                "moe-convert",
                "freeze " + t.ckpt + " -o " + locked + "/x.h5",
                {"cannot create '" + locked + "/x.h5'",
                 "no permission to write in directory '" + locked + "'"}}});
    fs::permissions(locked, fs::perms::owner_all);
  }
  // Bits flipped in tensor data (Fletcher32): "reading the data failed: the file is damaged:
  // checksum mismatch" (before: "H5Dread(dataset, type, memory, ...) failed: ...").
  const std::string bytes = test::read_file(t.ckpt);
  int damaged = 0;
  for (int eighth = 3; eighth <= 5; ++eighth) {
    std::string copy = bytes;
    copy[copy.size() * eighth / 8] ^= 0x10;
    const std::string path = dir / "damaged.h5";
    test::write_file(path, copy);
    const test::RunResult r = run_command(tool("moe-convert", "inspect --verify " + path));
    if (r.exit_code == 0) continue;  // padding: nothing read is damaged
    expect_words(r, "moe-convert", {path});
    damaged += r.err.find("the file is damaged: checksum mismatch") != std::string::npos;
  }
  REQUIRE(damaged > 0);
}

