// -v adds output in every tool: what is running on what (version, threads), then the library's
// debug lines (the configs a run resolved, files read and written with their sizes and times).
// Without -v none of it is printed.
#include <catch2/catch.hpp>
#include <string>
#include <utility>

#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;

namespace {

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("cli: -v adds debug lines to every tool, and only -v does", "[cli]") {
  test::ScratchDir dir("cli-verbose");
  const std::string data = test::fortunes_path("linux");
  std::string tiny = test::kTinyMixtral;  // without its -q (which -v does not override)
  tiny.erase(tiny.rfind(" -q"));
  const std::string train = tool("moe-train", "--data " + data + tiny + " --steps 2 --out ");
  const test::RunResult quiet = run_command(train + (dir / "plain"));
  INFO(quiet.err);
  REQUIRE(quiet.exit_code == 0);
  REQUIRE(!has(quiet.err, "[debug]"));
  const test::RunResult loud = run_command(train + (dir / "run") + " -v");
  INFO(loud.err);
  REQUIRE(loud.exit_code == 0);
  REQUIRE(has(loud.err, "[debug] moe-train "));
  REQUIRE(has(loud.err, " threads of "));
  REQUIRE(has(loud.err, "[debug] model config: {"));
  REQUIRE(has(loud.err, "[debug] training config: {"));
  REQUIRE(has(loud.err, "[debug] token file " + data + " (text): "));
  REQUIRE(has(loud.err, "[debug] wrote checkpoint "));

  const std::string model = dir / "run/last.h5";
  // Each tool's command, writing to `out` (a name of its own for each run).
  auto command = [&](const std::string& name, const std::string& out) {
    if (name == "moe-infer")
      return tool("moe-infer", "score --model " + model + " --data " + data +
                                   " --max-sequences 2 -o " + (dir / out));
    if (name == "moe-profile")
      return tool("moe-profile", "record --model " + model + " --data " + data +
                                     " --max-tokens 256 -o " + (dir / out));
    if (name == "moe-distill")
      return tool("moe-distill", "--teacher " + model + " --data " + data +
                                     " --student-experts 2 --steps 1 --batch 2 --eval-batches 1"
                                     " --threads 1 -o " +
                                     (dir / out));
    return tool("moe-convert", "dtype " + model + " --to bf16 -o " + (dir / out));
  };
  const std::pair<std::string, std::string> cases[] = {
      {"moe-infer", "[debug] opened checkpoint "},  // its weights mapped, not read
      {"moe-profile", "[debug] token file "},
      {"moe-distill", "[debug] read checkpoint "},
      {"moe-convert", "[debug] wrote checkpoint "},
  };
  for (const auto& [name, line] : cases) {
    INFO(name);
    const std::string ext = name == "moe-infer" ? ".jsonl" : ".h5";
    const test::RunResult r = run_command(command(name, name + "-v" + ext) + " -v");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    REQUIRE(has(r.err, "[debug] " + name + " "));
    REQUIRE(has(r.err, line));
    const test::RunResult plain = run_command(command(name, name + ext));
    INFO(plain.err);
    REQUIRE(plain.exit_code == 0);
    REQUIRE(!has(plain.err, "[debug]"));
  }
}
