// moe-train's routing defaults as a user meets them: --aux-loss-coef 0.05 unless given (the
// library's ModelConfig keeps 0.01), and a resumed run keeps the coefficient it trained with.
#include <catch2/catch.hpp>

#include "moe/io/checkpoint.h"
#include "support/run.h"

using namespace moe;

TEST_CASE(
    "cli: moe-train's --aux-loss-coef defaults to 0.05, a given value and a resume keep theirs",
    "[cli]") {
  test::ScratchDir dir("routing-defaults");
  const std::string tiny = test::kTinyMixtral + " --steps 1 --checkpoint-every 1";
  auto aux_of = [](const std::string& checkpoint) {
    return io::load_checkpoint(checkpoint).model_config.at("aux_loss_coef").get<double>();
  };
  REQUIRE(aux_of(test::train_on_fortunes(dir / "default", tiny)) == 0.05);
  const std::string old = test::train_on_fortunes(dir / "given", tiny + " --aux-loss-coef 0.01");
  REQUIRE(aux_of(old) == 0.01);
  // The model (its coefficients included) comes from the checkpoint when resumed: the default
  // does not replace what the run trained with.
  auto r = test::run_command(test::tool_path("moe-train") + " --resume " + old + " --out " +
                             (dir / "given") + " --steps 2 --threads 1 -q");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(aux_of(dir / "given/step-00000002.h5") == 0.01);
}
