// One overwrite rule for every tool (issue 45, item 8): an output that names an existing regular
// file is refused before any work, naming the file and --force, and the file is left as it was;
// with --force it is replaced. Before the rule, moe-train --metrics/--trace, moe-infer -o and
// --summary, moe-profile record/paths/plot/plot-metrics -o, moe-distill --metrics/--summary and
// moe-convert export-hf replaced what was there without a word. The one exception: a resumed
// moe-train run appends to its own --metrics file.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

const std::string kPrecious = "precious bytes another run wrote\n";

// A tiny mixtral, what each output is made from (a trace, metrics, a GGUF and an HF directory),
// and the inputs of generate and loglikelihood.
struct Fixture {
  test::ScratchDir dir{"cli-overwrite"};
  std::string data = test::fortunes_path("linux");
  std::string ckpt, trace = dir / "fixture-trace.h5", metrics = dir / "fixture-metrics.jsonl",
                    gguf = dir / "fixture.gguf", hf = dir / "fixture-hf",
                    prompts = dir / "prompts.txt", requests = dir / "requests.jsonl";
  Fixture() {
    ckpt = test::train_on_fortunes(dir / "run",
                                   test::kTinyMixtral + " --steps 2 --metrics " + metrics);
    test::write_file(prompts, "Linux is\n");
    test::write_file(requests, "{\"context\": \"Linux \", \"continuation\": \"is\"}\n");
    for (const std::string& args : {"moe-profile record -q --model " + ckpt + " --data " + data +
                                        " --max-tokens 64 -o " + trace,
                                    "moe-convert export-gguf -q " + ckpt + " -o " + gguf,
                                    "moe-convert export-hf -q " + ckpt + " -o " + hf}) {
      const size_t space = args.find(' ');
      const test::RunResult r = run_command(tool(args.substr(0, space), args.substr(space + 1)));
      INFO(args << "\n" << r.err);
      REQUIRE(r.exit_code == 0);
    }
  }
};

struct Output {
  std::string tool, args;  // "{out}" stands for the output, "{run}" for a fresh run directory
  std::string out;         // the file the output names (export-hf: its directory)
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

std::string substitute(std::string text, const std::string& key, const std::string& value) {
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size()))
    text.replace(at, key.size(), value);
  return text;
}

}  // namespace

TEST_CASE("cli: every output refuses an existing file without --force", "[cli][out][force]") {
  Fixture& f = fixture();
  const std::string train = "--data " + f.data + " --out {run}" + test::kTinyMixtral + " --steps 2";
  const std::string distill = "--teacher " + f.ckpt + " --data " + f.data +
                              " -o {run} --student-layers 1 --batch 4 --eval-batches 1 --steps 2"
                              " --threads 1 -q";
  const std::string model = " --model " + f.ckpt + " --threads 1 -q";
  const std::vector<Output> outputs = {
      {"moe-train", train + " --metrics {out}", "metrics.jsonl"},
      {"moe-train", train + " --trace {out}", "train-trace.h5"},
      {"moe-infer", "score --data " + f.data + " --max-sequences 2 -o {out}" + model,
       "scores.jsonl"},
      {"moe-infer", "score --data " + f.data + " --max-sequences 2 --summary {out}" + model,
       "summary.json"},
      {"moe-infer", "generate --prompts " + f.prompts + " --max-new 2 -o {out}" + model,
       "gen.jsonl"},
      {"moe-infer", "loglikelihood --requests " + f.requests + " -o {out}" + model, "ll.jsonl"},
      {"moe-profile", "record --data " + f.data + " --max-tokens 64 -o {out}" + model, "trace.h5"},
      {"moe-profile", "paths -q " + f.trace + " --path-length 1 -o {out}", "paths.json"},
      {"moe-profile", "plot -q " + f.trace + " -o {out}", "plot.svg"},
      {"moe-profile", "plot-metrics -q " + f.metrics + " -o {out}", "curves.svg"},
      {"moe-distill", distill + " --metrics {out}", "distill-metrics.jsonl"},
      {"moe-distill", distill + " --summary {out}", "distill-summary.json"},
      {"moe-convert", "export-hf -q " + f.ckpt + " -o {out}", "hf"},
      // These refused before the rule; they stay in the table so that every output is held to it.
      {"moe-convert", "dtype -q --to bf16 " + f.ckpt + " -o {out}", "bf16.h5"},
      {"moe-convert", "freeze -q " + f.ckpt + " -o {out}", "frozen.h5"},
      {"moe-convert", "quantize -q " + f.ckpt + " -o {out}", "q8.h5"},
      {"moe-convert", "export-gguf -q " + f.ckpt + " -o {out}", "model.gguf"},
      {"moe-convert", "import-hf -q " + f.hf + " -o {out}", "imported.h5"},
      {"moe-convert", "import-gguf -q " + f.gguf + " -o {out}", "from-gguf.h5"},
  };
  int runs = 0;
  for (const Output& o : outputs) {
    const std::string out = f.dir / o.out;
    const bool directory = o.tool == "moe-convert" && o.args.rfind("export-hf", 0) == 0;
    // An earlier export-hf is a directory holding config.json; every other output one file.
    const std::string precious = directory ? out + "/config.json" : out;
    if (directory) fs::create_directories(out);
    test::write_file(precious, kPrecious);
    const std::string args = substitute(o.args, "{out}", out);
    const std::string first = substitute(args, "{run}", f.dir / ("run-" + std::to_string(++runs)));
    INFO(o.tool << " " << first);
    const test::RunResult refused = run_command(tool(o.tool, first));
    INFO(refused.err);
    CHECK(refused.exit_code == 1);
    CHECK(refused.err.find(o.tool + ": error: '" + precious +
                           "' already exists; remove it or pass --force to replace it") !=
          std::string::npos);
    CHECK(test::read_file(precious) == kPrecious);  // byte for byte

    const std::string again = substitute(args, "{run}", f.dir / ("run-" + std::to_string(++runs)));
    const test::RunResult forced = run_command(tool(o.tool, again + " --force"));
    INFO(forced.err);
    CHECK(forced.exit_code == 0);
    CHECK(test::read_file(precious) != kPrecious);
  }
}

TEST_CASE("cli: a usage error comes before the overwrite refusal", "[cli][out][force]") {
  Fixture& f = fixture();
  const std::string png = f.dir / "exists.png";
  test::write_file(png, kPrecious);
  // A picture named .png is a usage error (exit 2) whether or not the file exists.
  const test::RunResult r = run_command(tool("moe-profile", "plot -q " + f.trace + " -o " + png));
  INFO(r.err);
  REQUIRE(r.exit_code == 2);
  REQUIRE(r.err.find("name the file *.svg") != std::string::npos);
  REQUIRE(test::read_file(png) == kPrecious);
}

TEST_CASE("cli: a device output is written into without --force", "[cli][out][force]") {
  Fixture& f = fixture();
  // /dev/null is no file to replace: a stream writes into it, as into stdout (-o -).
  const test::RunResult r = run_command(tool("moe-infer", "score --data " + f.data +
                                                              " --max-sequences 2 -o /dev/null"
                                                              " --summary - --model " +
                                                              f.ckpt + " --threads 1 -q"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("\"ppl\"") != std::string::npos);
}

TEST_CASE("cli: a resumed run appends to its --metrics without --force", "[cli][out][force]") {
  test::ScratchDir dir("cli-overwrite-resume");
  const std::string data = test::fortunes_path("linux");
  const std::string metrics = dir / "metrics.jsonl";
  const std::string train = "--data " + data + test::kTinyMixtral + " --log-every 1";
  test::RunResult r = run_command(
      tool("moe-train", train + " --out " + (dir / "run") + " --steps 2 --metrics " + metrics));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::string before = test::read_file(metrics);
  REQUIRE(!before.empty());
  r = run_command(tool("moe-train", "--resume " + (dir / "run") + " --out " + (dir / "run") +
                                        " --steps 4 --log-every 1 -q --metrics " + metrics));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::string after = test::read_file(metrics);
  REQUIRE(after.size() > before.size());
  REQUIRE(after.compare(0, before.size(), before) == 0);  // the first run's lines kept
  REQUIRE(after.find("\"step\":3") != std::string::npos);
  // The same file for a fresh run is another run's record: refused, and kept.
  r = run_command(
      tool("moe-train", train + " --out " + (dir / "fresh") + " --steps 2 --metrics " + metrics));
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find("'" + metrics + "' already exists") != std::string::npos);
  REQUIRE(test::read_file(metrics) == after);
}
