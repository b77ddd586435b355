// moe-train --sliding-window N and --tie-embeddings (issue 44) as a user runs them: a tiny mixtral
// trains with both, its checkpoint records them (no lm_head.weight), moe-infer scores it as the
// trainer evaluated it, and a window below 0 is refused by name.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "moe/io/checkpoint.h"
#include "moe/models/config.h"
#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;

TEST_CASE("cli: moe-train --sliding-window and --tie-embeddings", "[cli][window]") {
  test::ScratchDir dir("cli-window-tied");
  const std::string run = dir / "run";
  const std::string flags =
      " --arch mixtral --layers 2 --d-model 16 --heads 2 --kv-heads 1 --d-ff 32 --seq 16"
      " --experts 4 --moe-every 1 --batch 4 --threads 1 -q --steps 3 --checkpoint-every 3 "
      "--eval-every 0";
  auto r = run_command(tool("moe-train", "--data " + test::fortunes_path("linux") + " --out " +
                                             run + flags + " --sliding-window 5 --tie-embeddings"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const io::Checkpoint last = io::load_checkpoint(run + "/step-00000003.h5");
  const ModelConfig mc = model_config_from_json(last.model_config);
  CHECK(mc.sliding_window == 5);
  CHECK(mc.window_layers.empty());
  CHECK(mc.tie_embeddings);
  for (const io::NamedTensor& p : last.params) CHECK(p.name != "lm_head.weight");
  auto s =
      run_command(tool("moe-infer", "score --model " + run + "/step-00000003.h5 --data " +
                                        test::fortunes_path("linux") + " --max-sequences 4 -q"));
  INFO(s.err);
  CHECK(s.exit_code == 0);

  auto bad = run_command(tool("moe-train", "--data " + test::fortunes_path("linux") + " --out " +
                                               (dir / "bad") + flags + " --sliding-window -1"));
  CHECK(bad.exit_code != 0);
  CHECK(bad.err.find("sliding window must be between 0") != std::string::npos);
}
