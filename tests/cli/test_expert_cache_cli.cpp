// moe-infer --expert-budget --expert-cache as a user runs it: scores the bytes of the resident
// model (f32 and bf16, LRU and LFU, with and without experts pinned from a trace moe-profile
// record wrote, with and without --prefetch: the trace's estimate, the next layer's router before
// or after a MoE block), reports hit rates beside Belady's and the next-layer estimate with the
// prefetches issued, used and wasted, and refuses a budget below one expert, a trace of another
// model and flags without their budget, cache or trace, in words (quantised checkpoints:
// test_quantised_experts_cli.cpp).
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;

namespace {

struct Models {
  test::ScratchDir dir{"cli-expert-cache"};
  std::string f32, bf16, data, trace;
  Models() {
    f32 = test::train_on_fortunes(dir / "run", test::kTinyMixtral + " --steps 2");
    bf16 = dir / "bf16.h5";
    data = test::fortunes_path("linux");
    trace = dir / "trace.h5";
    auto r = run_command(tool("moe-convert", "dtype " + f32 + " --to bf16 -o " + bf16));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    r = run_command(tool("moe-profile", "record --model " + f32 + " --data " + data +
                                            " --batch 4 --max-tokens 512 -o " + trace));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
};

Models& models() {
  static Models m;
  return m;
}

}  // namespace

TEST_CASE("cli: moe-infer --expert-cache scores the resident model's bytes", "[cli]") {
  Models& m = models();
  for (const std::string& model : {m.f32, m.bf16}) {
    const std::string score =
        "score --model " + model + " --data " + m.data + " --batch 4 --max-sequences 12";
    auto resident = run_command(tool("moe-infer", score));
    INFO(resident.err);
    REQUIRE(resident.exit_code == 0);
    for (const std::string& flags :
         {std::string(" --expert-budget 25% --expert-cache lru"),
          std::string(" --expert-budget 50% --expert-cache lfu"),
          std::string(" --expert-budget 50% --expert-cache lru --pin-from ") + m.trace,
          std::string(" --expert-budget 75% --expert-cache lfu --prefetch --pin-from ") + m.trace,
          std::string(" --expert-budget 25% --expert-cache lru --prefetch router"),
          std::string(" --expert-budget 50% --expert-cache lfu --prefetch router-output "
                      "--prefetch-margin 1")}) {
      auto cached = run_command(tool("moe-infer", score + flags));
      INFO(model << flags << "\n" << cached.err);
      REQUIRE(cached.exit_code == 0);
      REQUIRE(cached.out == resident.out);
      REQUIRE(cached.err.find("expert cache: ") != std::string::npos);
      REQUIRE(cached.err.find("Belady") != std::string::npos);
      const bool pinned = flags.find("--pin-from") != std::string::npos;
      // 50% of 8 experts: 4 slots, 2 pinned from the trace; 75%: 6 slots, 3 pinned.
      if (pinned)
        REQUIRE((cached.err.find("2 slots and 2 pinned experts") != std::string::npos ||
                 cached.err.find("3 slots and 3 pinned experts") != std::string::npos));
      const bool prefetch = flags.find("--prefetch") != std::string::npos;
      const bool router = flags.find("--prefetch router") != std::string::npos;
      REQUIRE((cached.err.find(" prefetched, ") != std::string::npos) == (pinned || router));
      if (prefetch) REQUIRE(cached.err.find(" 0 prefetched") == std::string::npos);
      if (prefetch) REQUIRE(cached.err.find(" displaced unused") != std::string::npos);
      REQUIRE((cached.err.find("next-layer estimate held") != std::string::npos) ==
              (pinned || router));
    }
  }
}

TEST_CASE("cli: moe-infer --expert-cache refuses what it cannot serve, in words", "[cli]") {
  Models& m = models();
  const std::string score = "score --data " + m.data + " --model ";
  const std::string other = m.dir / "other";
  const std::string other_trace = m.dir / "other-trace.h5";
  // kTinyMixtral's shape with 3 MoE layers instead of 2.
  const std::string big = test::train_on_fortunes(
      other,
      " --arch mixtral --layers 3 --d-model 16 --heads 2 --kv-heads 1 --d-ff 32 --seq 16"
      " --experts 4 --moe-every 1 --batch 4 --eval-batches 1 --threads 1 -q --steps 1");
  auto r = run_command(tool("moe-profile", "record --model " + big + " --data " + m.data +
                                               " --max-tokens 64 -o " + other_trace));
  REQUIRE(r.exit_code == 0);
  struct Case {
    std::string args;
    int code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {score + m.f32 + " --expert-budget 100 --expert-cache lru", 2,
       "--expert-budget 100 bytes is smaller than one expert ("},
      {score + m.f32 + " --expert-budget 50% --expert-cache lru --pin-from " + other_trace, 1,
       "the trace's 3 MoE layers have [4,4,4] experts, the model's 2 have [4,4]"},
      {score + m.f32 + " --expert-cache lfu", 2, "give a budget too"},
      {score + m.f32 + " --expert-budget 50% --pin-from " + m.trace, 2,
       "give --expert-cache lru|lfu"},
      {score + m.f32 + " --expert-budget 50% --expert-cache mru", 2, "mru"},
      // Issue 44 (d): both act through the trace; they were silently ignored without it.
      {score + m.f32 + " --expert-budget 50% --expert-cache lru --pin-share 0.25", 2,
       "--pin-share requires --pin-from"},
      {score + m.f32 + " --expert-budget 50% --expert-cache lru --prefetch", 2,
       "--prefetch requires --pin-from"},
      {score + m.f32 + " --expert-budget 50% --expert-cache lru --prefetch trace", 2,
       "--prefetch requires --pin-from"},
      // The router's prediction needs no trace, but reads into the cache: budget and cache.
      {score + m.f32 + " --prefetch router", 2,
       "--prefetch router reads the next layer's experts into the expert cache: give "
       "--expert-budget and --expert-cache lru|lfu"},
      {score + m.f32 + " --expert-budget 50% --prefetch router-output", 2,
       "--prefetch router-output reads ahead into the expert cache: give --expert-cache lru|lfu"},
      {score + m.f32 + " --expert-budget 50% --expert-cache lru --prefetch sideways", 2,
       "--prefetch sideways: must be trace, router, router-output or off"},
      {score + m.f32 +
           " --expert-budget 50% --expert-cache lru --prefetch router "
           "--prefetch-margin -1",
       2, "--prefetch-margin -1: must be 0 or more"},
      {score + m.f32 + " --expert-budget 50% --expert-cache lru --pin-from " + m.trace +
           " --prefetch --prefetch-margin 2",
       2, "--prefetch-margin widens the router's prediction: give --prefetch router"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    auto got = run_command(tool("moe-infer", c.args));
    INFO(got.err);
    REQUIRE(got.exit_code == c.code);
    REQUIRE(got.err.find("moe-infer: error: ") != std::string::npos);
    REQUIRE(got.err.find(c.message) != std::string::npos);
  }
}
