// --config files: keys spelt with dashes or underscores, flat keys for the subcommand run, and an
// unknown key or section refused (exit 2) naming it, never silently ignored.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

TEST_CASE("cli: moe-train --config refuses an unknown key and reads underscores", "[cli][config]") {
  test::ScratchDir dir("cli-config-train");
  const std::string data = " --data " + test::fortunes_path("linux") + " --threads 1";
  test::write_file(dir / "typo.toml", "d_model = 24\nstepz = 5\n");
  const test::RunResult typo = run_command(
      tool("moe-train", "--config " + (dir / "typo.toml") + data + " --out " + (dir / "a")));
  REQUIRE(typo.exit_code == 2);
  REQUIRE(typo.err.find("--config: unknown key 'stepz' (did you mean 'steps'?)") !=
          std::string::npos);
  REQUIRE(!fs::exists(dir / "a/last.h5"));
  // d_model (underscore) is --d-model.
  test::write_file(dir / "ok.toml", "d_model = 24\nheads = 2\nsteps = 1\n");
  const test::RunResult ok = run_command(
      tool("moe-train", "--config " + (dir / "ok.toml") + data + " --out " + (dir / "b")));
  INFO(ok.err);
  REQUIRE(ok.exit_code == 0);
  REQUIRE(ok.err.find("d_model 24,") != std::string::npos);
}

TEST_CASE("cli: moe-infer --config takes flat keys for the subcommand run, or its section",
          "[cli][config]") {
  test::ScratchDir dir("cli-config-infer");
  const std::string ckpt = test::train_on_fortunes(dir / "run", test::kTinyMixtral + " --steps 2");
  const std::string data = " --data " + test::fortunes_path("linux") + " --max-sequences 1 -q";
  test::write_file(dir / "flat.toml", "model = \"" + ckpt + "\"\n");
  test::write_file(dir / "section.toml", "[score]\nmodel = \"" + ckpt + "\"\n");
  const std::string want = run_command(tool("moe-infer", "score --model " + ckpt + data)).out;
  REQUIRE(!want.empty());
  for (const std::string& args : {"score --config " + (dir / "flat.toml") + data,
                                  "--config " + (dir / "flat.toml") + " score" + data,
                                  "score --config " + (dir / "section.toml") + data}) {
    INFO(args);
    const test::RunResult r = run_command(tool("moe-infer", args));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    REQUIRE(r.out == want);
  }
  test::write_file(dir / "other.toml", "max_new = 3\n");
  const test::RunResult other = run_command(
      tool("moe-infer", "score --model " + ckpt + " --config " + (dir / "other.toml") + data));
  REQUIRE(other.exit_code == 2);
  REQUIRE(other.err.find("'max-new' is a flag of the generate subcommand, which this command "
                         "does not run") != std::string::npos);
  test::write_file(dir / "section-typo.toml", "[scor]\nmodel = \"" + ckpt + "\"\n");
  const test::RunResult section =
      run_command(tool("moe-infer", "score --config " + (dir / "section-typo.toml") + data));
  REQUIRE(section.exit_code == 2);
  REQUIRE(section.err.find("--config: unknown section [scor]") != std::string::npos);
}

TEST_CASE("cli: moe-train warns when the flags leave its model without an MoE layer",
          "[cli][config]") {
  test::ScratchDir dir("cli-config-dense");
  const std::string flags = " --data " + test::fortunes_path("linux") +
                            " --d-model 16 --heads 2 --d-ff 32 --seq 16 --batch 4 --steps 1"
                            " --eval-batches 1 --threads 1";
  const test::RunResult dense =
      run_command(tool("moe-train", "--layers 1 --moe-every 2 --out " + (dir / "a") + flags));
  INFO(dense.err);
  REQUIRE(dense.exit_code == 0);
  REQUIRE(dense.err.find("[warning] the model has no MoE layer (--layers 1 with --moe-every 2") !=
          std::string::npos);
  const test::RunResult moe =
      run_command(tool("moe-train", "--layers 2 --moe-every 2 --out " + (dir / "b") + flags));
  REQUIRE(moe.exit_code == 0);
  REQUIRE(moe.err.find("no MoE layer") == std::string::npos);
}
