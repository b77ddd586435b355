// Text outputs (moe-infer -o and --summary, moe-train and moe-distill --metrics) on a full file
// system (issue 45): the tool exits 1 naming the file and the cause, and leaves no empty file and
// no cut-short line: a file it could not write at all is removed, one it filled part way keeps its
// complete lines. RLIMIT_FSIZE stands in for the full disk, as in test_hdf5_damage_cli.cpp: with
// SIGXFSZ ignored, write() past the limit fails with EFBIG where a full disk fails it with ENOSPC.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

// Runs `command` with files limited to `blocks` of 512 bytes. Its stdout and stderr go through a
// pipe (the limit would stop them reaching the capture file too): both end up in `err`, the exit
// status is parsed from the line the shell adds.
test::RunResult run_with_file_limit(int blocks, const std::string& command) {
  test::RunResult r =
      run_command("{ (ulimit -f " + std::to_string(blocks) + "; trap '' XFSZ; exec " + command +
                  ") 2>&1; echo \"exit status $?\"; } | cat");
  const size_t at = r.out.rfind("exit status ");
  REQUIRE(at != std::string::npos);
  r.exit_code = std::stoi(r.out.substr(at + 12));
  r.err = r.out.substr(0, at);
  return r;
}

void expect_write_error(const test::RunResult& r, const std::string& tool_name,
                        const std::string& path) {
  INFO(r.err);
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find(tool_name + ": error: writing '" + path + "' failed: File too large") !=
          std::string::npos);
}

}  // namespace

TEST_CASE("cli: a text output the disk has no room for leaves no file", "[cli][out]") {
  test::ScratchDir dir("cli-full-disk-outputs");
  const std::string data = test::fortunes_path("linux");
  const std::string ckpt = test::train_on_fortunes(dir / "run", test::kTinyMixtral + " --steps 2");
  const std::string out = dir / "scores.jsonl", metrics = dir / "metrics.jsonl";
  // Before: exit 1 with "writing ... did not complete" (no cause) and a 0-byte file.
  expect_write_error(run_with_file_limit(0, tool("moe-infer", "score --model " + ckpt + " --data " +
                                                                  data + " -q -o " + out)),
                     "moe-infer", out);
  REQUIRE_FALSE(fs::exists(out));
  expect_write_error(
      run_with_file_limit(
          0, tool("moe-train", "--data " + data + " --out " + (dir / "train") + test::kTinyMixtral +
                                   " --steps 2 --metrics " + metrics)),
      "moe-train", metrics);
  REQUIRE_FALSE(fs::exists(metrics));
  // The same commands without the limit write both.
  REQUIRE(run_command(tool("moe-infer", "score --model " + ckpt + " --data " + data +
                                            " -q --max-sequences 4 -o " + out))
              .exit_code == 0);
  REQUIRE(fs::file_size(out) > 0);
}

TEST_CASE("cli: metrics cut short by a full disk keep only complete lines", "[cli][out]") {
  test::ScratchDir dir("cli-full-disk-metrics");
  const std::string metrics = dir / "metrics.jsonl";
  // 512 bytes hold the first line or two of metrics, then a write stops part way through a line.
  // Before: the write error went unnoticed, training carried on, and the file ended mid-line.
  const test::RunResult r = run_with_file_limit(
      1,
      tool("moe-train", "--data " + test::fortunes_path("linux") + " --out " + (dir / "train") +
                            test::kTinyMixtral + " --steps 6 --log-every 1 --metrics " + metrics));
  expect_write_error(r, "moe-train", metrics);
  const std::string text = test::read_file(metrics);
  REQUIRE(!text.empty());
  REQUIRE(text.back() == '\n');
  for (const std::string& line : test::lines_of(text)) {
    INFO(line);
    REQUIRE(nlohmann::json::parse(line).contains("loss"));
  }
  // The run stopped at the failed write, before its checkpoint.
  REQUIRE_FALSE(fs::exists(dir / "train/last.h5"));
}
