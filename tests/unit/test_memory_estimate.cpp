// Memory estimates made before allocating: a lower bound on the parameters of every flavour (so a
// model that fits is never refused), and refusals that give the figure and the machine's.
#include <catch2/catch.hpp>

#include "moe/arena.h"
#include "moe/models/memory.h"
#include "moe/models/transformer.h"
#include "moe/param.h"
#include "support/gradcheck.h"
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

TEST_CASE("memory: the inference activation estimate is a lower bound of evaluate's peak",
          "[memory][infer]") {
  // evaluate reports the most bytes its arenas held at once (the caller's and the scratch); the
  // estimate counts only the largest tensors of one block and one block of logits, so it is below
  // that, and within 3x of it (what it leaves out: norms, router rows, residual sums, the
  // attention context and output).
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    for (int64_t windows : {1, 12}) {
      INFO(arch_name(arch) << ", " << windows << " windows");
      ModelConfig c = test::small_model_config(arch);
      c.resolve();
      ParamSet params(2, DType::f32);
      Transformer model(c, params);
      const Tensor ids = test::random_ids({windows, c.seq}, 3, int32_t(c.vocab_size));
      Arena arena;
      ForwardStats stats;
      {
        ArenaScope scope(arena);
        stats = model.evaluate(ids, ids, EvalOptions{});
      }
      const double bound = inference_activation_lower_bound(c, windows);
      INFO("bound " << bound << ", peak " << stats.activation_peak_bytes);
      REQUIRE(bound > 0);
      REQUIRE(bound <= double(stats.activation_peak_bytes));
      REQUIRE(double(stats.activation_peak_bytes) <= 3 * bound);
    }
  }
}

TEST_CASE("memory: an inference batch whose activations do not fit is refused with the figures",
          "[memory][infer]") {
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.vocab_size = 50304;
  c.resolve();
  const double bound = inference_activation_lower_bound(c, 8);
  FreeMemory plenty;
  plenty.available_bytes = 4 * bound;
  check_inference_activations(c, 8, "scoring 8 windows", "detail", plenty);
  FreeMemory tight;
  tight.available_bytes = 64e9;
  tight.address_space_left = bound / 2;
  REQUIRE(
      test::error_of([&] {
        check_inference_activations(c, 8, "scoring 8 windows", "a smaller batch needs less", tight);
      }) == str("scoring 8 windows needs at least ", format_bytes(bound),
                " of activations (a smaller batch needs less), more than this process can still "
                "get: 59.6 GiB of memory free (RLIMIT_AS leaves ",
                format_bytes(bound / 2), " of address space)"));
  FreeMemory unknown;
  check_inference_activations(c, 8, "scoring 8 windows", "detail", unknown);  // never refuses
}

TEST_CASE("memory: inference weights that do not fit are refused before they are allocated",
          "[memory][infer]") {
  // Issue 45: a model too large for the memory left failed with a bare std::bad_alloc part-way
  // through loading; infer::load_model now asks this first.
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.resolve();
  const double all = parameter_lower_bound(c, 1) * 4, dense = parameter_lower_bound(c, 0) * 4;
  REQUIRE(dense < all);
  FreeMemory tight;
  tight.available_bytes = 64e9;
  tight.address_space_left = (dense + all) / 2;  // room for the weights without the experts
  REQUIRE(test::error_of([&] {
            check_inference_weights(c, 1, 4, "'big.h5'", "the experts resident", tight);
          }) == str("'big.h5': its weights need at least ", format_bytes(all),
                    " (the experts resident), more than this process can still get: 59.6 GiB of "
                    "memory free (RLIMIT_AS leaves ",
                    format_bytes((dense + all) / 2), " of address space)"));
  check_inference_weights(c, 0, 4, "'big.h5'", "streamed", tight);  // the experts stay on disk
  FreeMemory unknown;
  check_inference_weights(c, 1, 4, "'big.h5'", "detail", unknown);  // never refuses
  // The expert ring asks the same before allocating its slots (ExpertRing::start).
  FreeMemory small;
  small.address_space_left = 2 << 20;
  REQUIRE(test::error_of([&] { check_free_memory(3 << 20, "3 slots (3.0 MiB)", small); }) ==
          "3 slots (3.0 MiB), more than this process can still get: an unknown amount of memory "
          "free (RLIMIT_AS leaves 2.0 MiB of address space)");
  REQUIRE(test::error_of([&] { check_free_memory(1 << 20, "1 slot", small); }) == "(no error)");
}
