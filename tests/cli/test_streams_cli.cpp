// "-" is stdout (or stdin) in every tool, as samtools users expect, and is refused where an output
// cannot go there; two outputs never share stdout.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

// A tiny model and a routing trace of it, made once in a scratch directory.
struct Traced {
  test::ScratchDir dir{"cli-streams"};
  std::string ckpt, trace;
  Traced() {
    ckpt = test::train_on_fortunes(dir / "run", test::kTinyMixtral + " --steps 2");
    trace = dir / "trace.h5";
    const test::RunResult r = run_command(
        tool("moe-profile", "record --model " + ckpt + " --data " + test::fortunes_path("linux") +
                                " --max-tokens 512 -q -o " + trace));
    if (r.exit_code != 0) FAIL("moe-profile record: " << r.err);
  }
};

Traced& traced() {
  static Traced t;
  return t;
}

// Runs `command` in `cwd` (so a file named "-" would land there).
test::RunResult run_in(const std::string& cwd, const std::string& command) {
  return run_command("cd " + cwd + " && " + command);
}

}  // namespace

TEST_CASE("cli: -o - writes text outputs to stdout and no file named '-'", "[cli][streams]") {
  Traced& t = traced();
  const std::string cwd = t.dir / "cwd-text";
  fs::create_directories(cwd);
  const test::RunResult paths =
      run_in(cwd, tool("moe-profile", "paths " + t.trace + " --path-length 1 -o - -q"));
  INFO(paths.err);
  REQUIRE(paths.exit_code == 0);
  REQUIRE(paths.out.rfind("{\"experts\":", 0) == 0);
  REQUIRE(paths.out.find("\"format\":\"moe.paths\"") != std::string::npos);
  // The table on stdout is the table a file gets.
  REQUIRE(run_command(tool("moe-profile",
                           "paths " + t.trace + " --path-length 1 -q -o " + (t.dir / "paths.json")))
              .exit_code == 0);
  REQUIRE(paths.out == test::read_file(t.dir / "paths.json"));
  const test::RunResult plot = run_in(cwd, tool("moe-profile", "plot " + t.trace + " -o - -q"));
  INFO(plot.err);
  REQUIRE(plot.exit_code == 0);
  REQUIRE(plot.out.rfind("<svg", 0) == 0);
  REQUIRE(plot.out.find("</svg>") != std::string::npos);
  REQUIRE(!fs::exists(fs::path(cwd) / "-"));
}

TEST_CASE("cli: -o - is refused where the output must appear whole, leaving no file '-'",
          "[cli][streams]") {
  Traced& t = traced();
  const std::string cwd = t.dir / "cwd-files";
  fs::create_directories(cwd);
  const std::string commands[] = {
      tool("moe-convert", "freeze " + t.ckpt + " -o -"),
      tool("moe-convert", "dtype " + t.ckpt + " --to bf16 -o -"),
      tool("moe-convert", "export-hf " + t.ckpt + " -o -"),
  };
  for (const std::string& command : commands) {
    INFO(command);
    const test::RunResult r = run_in(cwd, command);
    INFO(r.err);
    REQUIRE(r.exit_code == 2);
    REQUIRE(r.err.find("-o -: checkpoints are written to files, not to stdout") !=
            std::string::npos);
    REQUIRE(!fs::exists(fs::path(cwd) / "-"));
  }
}

TEST_CASE("cli: two outputs on stdout are refused before any work", "[cli][streams]") {
  test::ScratchDir dir("cli-streams-two");
  const std::string data = " --data " + test::fortunes_path("linux");
  const test::RunResult train =
      run_command(tool("moe-train", data + " --out " + (dir / "run") + test::kTinyMixtral +
                                        " --steps 2 --trace - --metrics -"));
  REQUIRE(train.exit_code == 2);
  REQUIRE(train.err.find("--metrics - and --trace - would all write to stdout") !=
          std::string::npos);
  REQUIRE(train.out.empty());
  REQUIRE(!fs::exists(dir / "run/last.h5"));
  const test::RunResult distill =
      run_command(tool("moe-distill", "--teacher " + (dir / "none.h5") + data + " --out " +
                                          (dir / "student") + " --metrics - --summary -"));
  REQUIRE(distill.exit_code == 2);
  REQUIRE(distill.err.find("--metrics - and --summary - would all write to stdout") !=
          std::string::npos);
}

TEST_CASE(
    "cli: moe-profile accuracy writes nothing to stdout when the inputs do not fit, and no source "
    "place",
    "[cli][streams]") {
  Traced& t = traced();
  // A path table of another model (8 experts, not 4) against this model's trace.
  const std::string other = test::train_on_fortunes(
      t.dir / "other",
      " --arch mixtral --layers 2 --d-model 16 --heads 2 --kv-heads 1 --d-ff 32"
      " --seq 16 --experts 8 --moe-every 1 --batch 4 --eval-batches 1 --steps 2"
      " --threads 1 -q");
  const std::string other_trace = t.dir / "other-trace.h5", table = t.dir / "other-paths.json";
  REQUIRE(run_command(tool("moe-profile", "record --model " + other + " --data " +
                                              test::fortunes_path("linux") +
                                              " --max-tokens 256 -q -o " + other_trace))
              .exit_code == 0);
  REQUIRE(
      run_command(tool("moe-profile", "paths " + other_trace + " --path-length 1 -q -o " + table))
          .exit_code == 0);
  const test::RunResult r = run_command(tool("moe-profile", "accuracy " + table + " " + t.trace));
  INFO(r.err);
  REQUIRE(r.exit_code != 0);
  REQUIRE(r.err.find("moe-profile: error: ") != std::string::npos);
  REQUIRE(r.out.empty());
  // The source place of the check is ours, not the user's: shown with -v only.
  REQUIRE(r.err.find(".cpp:") == std::string::npos);
  const test::RunResult verbose =
      run_command(tool("moe-profile", "accuracy " + table + " " + t.trace + " -v"));
  REQUIRE(verbose.err.find("paths.cpp:") != std::string::npos);
}

TEST_CASE("cli: each subcommand's --help lists only its own flags", "[cli][streams]") {
  const test::RunResult generate = run_command(tool("moe-infer", "generate --help"));
  REQUIRE(generate.exit_code == 0);
  REQUIRE(generate.out.find("--max-new") != std::string::npos);
  for (const char* score_only : {"--ep", "--popularity", "--max-sequences", "--data"}) {
    INFO(score_only);
    REQUIRE(generate.out.find(score_only) == std::string::npos);
  }
  const test::RunResult score = run_command(tool("moe-infer", "score --help"));
  REQUIRE(score.exit_code == 0);
  for (const char* flag : {"--ep", "--popularity", "--max-sequences"}) {
    INFO(flag);
    REQUIRE(score.out.find(flag) != std::string::npos);
  }
  REQUIRE(score.out.find("--max-new") == std::string::npos);
}

TEST_CASE("cli: a mistyped flag or subcommand is named, with the nearest valid one",
          "[cli][streams]") {
  struct Case {
    std::string tool, args, message;
  };
  const Case cases[] = {
      {"moe-profile", "summry trace.h5", "unknown subcommand 'summry' (did you mean summary?)"},
      {"moe-infer", "scor --model m.h5", "unknown subcommand 'scor' (did you mean score?)"},
      {"moe-convert", "bogus x", "unknown subcommand 'bogus' (one of "},
      {"moe-train", "--step 10 --data x", "unknown flag --step (did you mean --steps?)"},
      {"moe-train", "--data x --stepz=3", "unknown flag --stepz (did you mean --steps?)"},
      {"moe-infer", "score --modle m.h5 --data x", "unknown flag --modle (did you mean --model?)"},
      {"moe-infer", "generate --model m.h5 --prompts p --ep 2",
       "--ep is a flag of score, not of generate"},
  };
  for (const Case& c : cases) {
    INFO(c.tool << " " << c.args);
    const test::RunResult r = run_command(tool(c.tool, c.args));
    INFO(r.err);
    REQUIRE(r.exit_code == 2);
    REQUIRE(r.err.find(c.tool + ": error: " + c.message) != std::string::npos);
  }
}

TEST_CASE("cli: moe-infer generate skips blank prompt lines and names an unknown prompt key",
          "[cli][streams]") {
  Traced& t = traced();
  test::write_file(t.dir / "prompts.txt", "The\n\nA\n   \n");
  const test::RunResult r =
      run_command(tool("moe-infer", "generate --model " + t.ckpt + " --prompts " +
                                        (t.dir / "prompts.txt") + " --max-new 2 -q"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::vector<std::string> lines = test::lines_of(r.out);
  REQUIRE(lines.size() == 2);
  REQUIRE(lines[0].find("\"prompt\":\"The\"") != std::string::npos);
  REQUIRE(lines[1].find("\"prompt\":\"A\"") != std::string::npos);
  test::write_file(t.dir / "prompts.jsonl", "{\"prompt\": \"The\", \"max_tokens\": 5}\n");
  const test::RunResult bad = run_command(
      tool("moe-infer", "generate --model " + t.ckpt + " --prompts " + (t.dir / "prompts.jsonl")));
  REQUIRE(bad.exit_code == 1);
  REQUIRE(bad.err.find("prompts.jsonl:1: unknown key \"max_tokens\"") != std::string::npos);
  REQUIRE(bad.out.empty());
}

TEST_CASE("cli: --data - reads stdin where the data is read once, and training refuses it",
          "[cli][streams]") {
  Traced& t = traced();
  const std::string data = test::fortunes_path("linux");
  const std::string score = "score --model " + t.ckpt + " --max-sequences 3 -q --data ";
  const test::RunResult from_file = run_command(tool("moe-infer", score + data));
  const test::RunResult from_stdin =
      run_command("cat " + data + " | " + tool("moe-infer", score + "-"));
  INFO(from_stdin.err);
  REQUIRE(from_file.exit_code == 0);
  REQUIRE(from_stdin.exit_code == 0);
  REQUIRE(!from_file.out.empty());
  REQUIRE(from_stdin.out == from_file.out);
  const test::RunResult record = run_command(
      "cat " + data + " | " +
      tool("moe-profile", "record --model " + t.ckpt + " --data - --max-tokens 256 -q -o " +
                              (t.dir / "stdin-trace.h5")));
  INFO(record.err);
  REQUIRE(record.exit_code == 0);
  REQUIRE(fs::exists(t.dir / "stdin-trace.h5"));
  for (const std::string& command :
       {tool("moe-train", "--data - --out " + (t.dir / "stdin-run") + test::kTinyMixtral),
        tool("moe-distill", "--teacher " + t.ckpt + " --data - --out " + (t.dir / "stdin-st"))}) {
    INFO(command);
    const test::RunResult r = run_command("cat " + data + " | " + command);
    REQUIRE(r.exit_code == 2);
    REQUIRE(r.err.find("--data -: training reads its data on every rank and again when it "
                       "resumes, so it needs a file") != std::string::npos);
  }
  REQUIRE(!fs::exists(t.dir / "stdin-run"));
}
