// Memory estimates made before allocating: a lower bound on the parameters of every flavour (so a
// model that fits is never refused), and refusals that give the figure and the machine's.
#include <catch2/catch.hpp>

#include "moe/models/memory.h"
#include "moe/models/transformer.h"
#include "moe/param.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;

TEST_CASE("memory: the parameter estimate is a lower bound within 25% for every flavour",
          "[memory][validation]") {
  struct Case {
    const char* name;
    ModelConfig config;
  };
  std::vector<Case> cases;
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    ModelConfig c = test::small_model_config(arch);
    cases.push_back({arch == Arch::gpt ? "gpt" : "mixtral", c});
    c.moe_every = 2;
    c.layers = 3;
    cases.push_back({"every other block dense", c});
    c.experts_per_layer = {0, 8, 4};
    cases.push_back({"pyramid", c});
    c = test::small_model_config(arch);
    c.residual_moe = true;
    cases.push_back({"residual", c});
  }
  for (Case& c : cases) {
    INFO(c.name << " " << arch_name(c.config.arch));
    c.config.resolve();
    ParamSet params(1, c.config.dtype);
    Transformer model(c.config, params);
    const double actual = double(model.num_params());
    const double bound = parameter_lower_bound(c.config);
    REQUIRE(bound <= actual);
    REQUIRE(bound >= 0.75 * actual);
    REQUIRE(parameter_lower_bound(c.config, 0) < bound);  // experts left out
  }
}

TEST_CASE("memory: absurd sizes are refused with the figure and the machine's",
          "[memory][validation]") {
  ModelConfig c = test::small_model_config(Arch::gpt);
  c.d_model = 1000000;
  c.heads = 1;
  c.resolve();
  const double bound = parameter_lower_bound(c);
  REQUIRE(bound > 2e12);  // attention alone: 2 layers x 4 D^2
  MachineMemory machine;
  machine.physical_bytes = 8.0 * (1 << 30);
  const std::string msg =
      test::error_of([&] { check_fits_in_memory(bound * 4, "this model", "weights", machine); });
  REQUIRE_THAT(msg, Catch::StartsWith("this model needs at least ") &&
                        Catch::Contains("TiB (weights), more than this machine has: 8.0 GiB of "
                                        "physical memory"));
  machine.address_space_limit = 1.0 * (1 << 30);
  REQUIRE_THAT(test::error_of([&] { check_fits_in_memory(2.0 * (1 << 30), "x", "y", machine); }),
               Catch::Contains("(address space limited to 1.0 GiB by RLIMIT_AS)"));
  REQUIRE(test::error_of([&] { check_fits_in_memory(0.5 * (1 << 30), "x", "y", machine); }) ==
          "(no error)");
  // Unknown figures never refuse; the real machine reports its memory.
  REQUIRE(test::error_of([&] { check_fits_in_memory(1e30, "x", "y", MachineMemory{}); }) ==
          "(no error)");
  REQUIRE(machine_memory().physical_bytes > 0);
  REQUIRE(format_bytes(1536) == "1.5 KiB");
  REQUIRE(format_bytes(100) == "100 bytes");
}
