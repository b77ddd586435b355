// moe-train's routing defaults as a user meets them: --aux-loss-coef 0.05 unless given (the
// library's ModelConfig keeps 0.01), and a resumed run keeps the coefficient it trained with; and
// the issue-21 MoE-layer flags (--shared-expert-ff, --router sigmoid, --balance-bias-rate) reach
// the checkpoint's tensors.
#include <catch2/catch.hpp>
#include <cmath>

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

TEST_CASE(
    "cli: moe-train --shared-expert-ff, --router sigmoid and --balance-bias-rate train a "
    "shared expert and a moving selection bias that the optimizer leaves alone",
    "[cli]") {
  test::ScratchDir dir("routing-free");
  const std::string ckpt =
      test::train_on_fortunes(dir / "run", test::kTinyMixtral +
                                               " --steps 3 --checkpoint-every 3 --shared-expert-ff"
                                               " 24 --router sigmoid --balance-bias-rate 0.01"
                                               " --aux-loss-coef 0");
  const io::Checkpoint c = io::load_checkpoint(ckpt);
  REQUIRE(c.model_config.at("router_scoring") == "sigmoid");
  REQUIRE(c.model_config.at("balance_bias_rate").get<double>() == 0.01);
  auto find = [&](const std::vector<io::NamedTensor>& list, const std::string& name) {
    for (const io::NamedTensor& t : list)
      if (t.name == name) return &t;
    return static_cast<const io::NamedTensor*>(nullptr);
  };
  for (const char* block : {"blocks.0", "blocks.1"}) {
    INFO(block);
    const std::string moe = std::string(block) + ".moe";
    const io::NamedTensor* shared = find(c.params, moe + ".shared.w1");
    REQUIRE(shared);
    REQUIRE(shared->tensor.shape() == Shape{24, 16});
    REQUIRE_FALSE(shared->expert);
    REQUIRE(find(c.optim, "adam.m." + moe + ".shared.w1"));
    const io::NamedTensor* bias = find(c.params, moe + ".router.bias");
    REQUIRE(bias);
    REQUIRE(bias->tensor.shape() == Shape{4});
    // Three steps of +-0.01 (or 0): every value at most 0.03 in size, not all zero.
    bool moved = false;
    for (float v : bias->tensor.to_vector()) {
      REQUIRE(std::fabs(v) <= 0.0301f);
      moved = moved || v != 0.0f;
    }
    REQUIRE(moved);
    REQUIRE_FALSE(find(c.optim, "adam.m." + moe + ".router.bias"));
  }
}
