// moe-convert export-gguf prints GgufExportSummary::notes (what a reader of the file should know
// that is not a tensor's type) as notes, apart from the fallbacks (tensors written in another type
// than asked), which are warnings: a gpt_oss trained with YaRN (moe-train's gpt_oss default,
// truncate false) is noted for llama.cpp's rounded correction range, and no tensor is named.
#include <catch2/catch.hpp>
#include <string>

#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;

TEST_CASE("cli: export-gguf prints the YaRN range as a note, not a fallback",
          "[cli][gguf][gpt_oss]") {
  test::ScratchDir dir("cli-export-gguf-notes");
  const std::string ckpt = test::train_on_fortunes(
      dir / "run",
      " --arch gpt_oss --layers 2 --d-model 16 --heads 4 --kv-heads 2 --head-dim 6 --d-ff 16"
      " --seq 16 --experts 4 --top-k 2 --rope-scaling yarn --rope-factor 2"
      " --original-max-position-embeddings 8 --batch 4 --steps 2 --warmup 1 --eval-batches 1"
      " --threads 1 -q");
  auto e = run_command(tool("moe-convert", "export-gguf " + ckpt + " -o " + (dir / "oss.gguf")));
  INFO(e.err);
  REQUIRE(e.exit_code == 0);
  REQUIRE_THAT(e.err, Catch::Contains("note: YaRN truncate false: llama.cpp floors / ceils"));
  // f32 throughout (the checkpoint's dtype): nothing went out in another type.
  REQUIRE_THAT(e.err, !Catch::Contains("[warning]"));
}
