// moe-convert import-gguf as a user runs it: a tiny mixtral trained on a real
// corpus, exported with export-gguf and imported back, scores its text with
// moe-infer exactly as the original does (every sequence's log-likelihood, bit
// for bit); an existing output is kept without
// --force; a file that is not GGUF is an error (exit 1) naming it.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "support/run.h"
#include "support/scores.h"

using namespace moe;
using test::run_command;
using test::tool;

TEST_CASE("cli: moe-convert import-gguf of export-gguf scores as the original", "[cli][gguf]") {
  test::ScratchDir dir("cli-gguf-import");
  const std::string ckpt = test::train_on_fortunes(dir / "run", test::kTinyMixtral + " --steps 3");
  const std::string gguf = dir / "m.gguf", back = dir / "back.h5";
  auto e = run_command(tool("moe-convert", "export-gguf " + ckpt + " -o " + gguf + " -q"));
  INFO(e.err);
  REQUIRE(e.exit_code == 0);
  auto i = run_command(tool("moe-convert", "import-gguf " + gguf + " -o " + back));
  INFO(i.err);
  REQUIRE(i.exit_code == 0);
  REQUIRE_THAT(i.err, Catch::Contains("imported a GGUF llama model as mixtral"));
  const std::string data = test::fortunes_path("linux");
  REQUIRE(test::score_lines(back, data) == test::score_lines(ckpt, data));

  // An existing output is kept unless --force.
  auto again = run_command(tool("moe-convert", "import-gguf " + gguf + " -o " + back));
  REQUIRE(again.exit_code != 0);
  REQUIRE_THAT(again.err, Catch::Contains("--force"));
  auto forced =
      run_command(tool("moe-convert", "import-gguf " + gguf + " -o " + back + " --force -q"));
  REQUIRE(forced.exit_code == 0);

  test::write_file(dir / "text.gguf", "not a GGUF file at all");
  auto bad = run_command(
      tool("moe-convert", "import-gguf " + (dir / "text.gguf") + " -o " + (dir / "x.h5")));
  REQUIRE(bad.exit_code == 1);
  REQUIRE_THAT(bad.err, Catch::Contains("moe-convert: error:") &&
                            Catch::Contains("is not a valid GGUF file: the magic is not 'GGUF'"));
}
