// moe-train's memory flags as a user runs them: --grad-accum and --recompute from the command
// line and from --config, saved in the checkpoint's training config, changeable on resume.
#include <catch2/catch.hpp>
#include <cstring>

#include "moe/io/checkpoint.h"
#include "support/bits.h"
#include "support/run.h"

using namespace moe;
using test::run_command;

namespace {

const std::string kTiny =
    " --layers 2 --d-model 16 --heads 2 --d-ff 32 --seq 16 --experts 4 --moe-every 1 --batch 4"
    " --eval-batches 2 --threads 2 --arch mixtral --kv-heads 1";

std::string train(const std::string& args) { return test::tool_path("moe-train") + " " + args; }

bool same_params(const io::Checkpoint& x, const io::Checkpoint& y) {
  if (x.params.size() != y.params.size()) return false;
  for (size_t i = 0; i < x.params.size(); ++i)
    if (x.params[i].name != y.params[i].name ||
        !test::bitwise_equal(x.params[i].tensor, y.params[i].tensor))
      return false;
  return true;
}

}  // namespace

TEST_CASE("cli: --grad-accum and --recompute train, are saved, and a resume may change them",
          "[cli]") {
  test::ScratchDir dir("cli-memory-flags");
  const std::string data = " --data " + test::fortunes_path("linux");
  // From a config file (underscores), the way a user keeps a run's settings.
  test::write_file(dir / "memory.toml", "grad_accum = 2\nrecompute = \"block\"\n");
  auto straight = run_command(train("--config " + dir / "memory.toml" + data + " --out " +
                                    dir / "a" + kTiny + " --steps 4 --checkpoint-every 2"));
  INFO(straight.err);
  REQUIRE(straight.exit_code == 0);
  const io::Checkpoint a = io::load_checkpoint(dir / "a/step-00000004.h5");
  REQUIRE(a.train_config["grad_accum"] == 2);
  REQUIRE(a.train_config["recompute"] == "block");

  // Recomputation changes no bit: resuming at step 2 without it ends where the straight run did.
  auto resumed = run_command(train("--resume " + dir / "a/step-00000002.h5" + " --out " +
                                   dir / "b" + " --steps 4 --threads 2 --recompute none"));
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  REQUIRE(resumed.err.find("--recompute \"block\" -> \"none\"") != std::string::npos);
  const io::Checkpoint b = io::load_checkpoint(dir / "b/step-00000004.h5");
  REQUIRE(b.train_config["recompute"] == "none");
  REQUIRE(b.train_config["grad_accum"] == 2);  // kept from the checkpoint
  REQUIRE(same_params(a, b));

  // A resume may change the micro-batch count too (another run from there: routing statistics
  // are per micro-batch), but it must still split the batch.
  auto split = run_command(train("--resume " + dir / "a/step-00000002.h5" + " --out " + dir / "c" +
                                 " --steps 4 --threads 2 --grad-accum 3"));
  REQUIRE(split.exit_code == 2);
  REQUIRE(split.err.find("--batch 4 does not split into --grad-accum 3") != std::string::npos);
  auto four = run_command(train("--resume " + dir / "a/step-00000002.h5" + " --out " + dir / "c" +
                                " --steps 4 --threads 2 --grad-accum 4"));
  INFO(four.err);
  REQUIRE(four.exit_code == 0);
  REQUIRE(io::load_checkpoint(dir / "c/step-00000004.h5").train_config["grad_accum"] == 4);
}
