// moe-infer --expert-budget (the ring) and --expert-budget --expert-cache on quantised checkpoints
// (moe-convert quantize --type q8_0, q4_k, q6_k, mxfp4, q4_k_m): the experts stream from the file
// at their stored bytes, stay in their block format in the slots and run on the resident model's
// kernels, so score and generate print exactly what the resident quantised model prints; the
// budget counts the bytes as stored. A damaged block scale in one expert is refused by both,
// naming the expert, as the resident loader refuses it.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"
#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;

namespace {

// Rows of 256 values: one q4_k / q6_k block, eight mxfp4 or q8_0 blocks.
const std::string kModel =
    " --arch mixtral --layers 2 --d-model 256 --heads 4 --kv-heads 2 --d-ff 256 --seq 16"
    " --experts 4 --moe-every 1 --batch 2 --eval-batches 1 --threads 1 -q --steps 2";

test::RunResult must_run(const std::string& program, const std::string& args) {
  auto r = run_command(tool(program, args));
  INFO(program << " " << args << "\n" << r.err);
  REQUIRE(r.exit_code == 0);
  return r;
}

}  // namespace

TEST_CASE("cli: quantised experts stream through the ring and the cache bitwise",
          "[cli][quantize][offload]") {
  test::ScratchDir dir("cli-quantised-experts");
  const std::string ckpt = test::train_on_fortunes(dir / "run", kModel);
  const std::string prompts = dir / "prompts.txt";
  test::write_file(prompts, "The quick brown\nUnix is\nA computer\n");
  const std::string data =
      " --data " + test::fortunes_path("computers") + " --max-sequences 6 --batch 3";
  // One expert's w1, w2, w3 [256,256] as stored: 256 rows of the format's row bytes each.
  struct Format {
    std::string type;
    int64_t row_bytes;
  };
  for (const Format& f : {Format{"q8_0", 272}, Format{"q4_k", 144}, Format{"q6_k", 210},
                          Format{"mxfp4", 136}, Format{"q4_k_m", 0}}) {
    const std::string q = dir / (f.type + ".h5");
    must_run("moe-convert", "quantize " + ckpt + " --type " + f.type + " -o " + q);
    const auto score = must_run("moe-infer", "score --model " + q + data);
    const auto generate =
        must_run("moe-infer", "generate --model " + q + " --prompts " + prompts + " --max-new 6");
    REQUIRE(test::lines_of(score.out).size() == 6);
    REQUIRE(test::lines_of(generate.out).size() == 3);
    // 25% of 2 layers x 4 experts: 2 cache slots; 60%: one whole layer (q4_k_m's layer 1, with
    // w2 in q6_k, is the larger), the ring's one slot.
    for (const std::string& flags : {std::string(" --expert-budget 25% --expert-cache lru"),
                                     std::string(" --expert-budget 50% --expert-cache lfu"),
                                     std::string(" --expert-budget 60%")}) {
      INFO(f.type << flags);
      const bool cache = flags.find("--expert-cache") != std::string::npos;
      const auto s = must_run("moe-infer", "score --model " + q + data + flags);
      REQUIRE(s.out == score.out);
      const auto g = must_run(
          "moe-infer", "generate --model " + q + " --prompts " + prompts + " --max-new 6" + flags);
      REQUIRE(g.out == generate.out);
      REQUIRE(s.err.find(cache ? "expert cache (" : "expert ring: ") != std::string::npos);
      if (f.row_bytes == 0) continue;  // q4_k_m: experts' w2 in q6_k in layer 1
      const int64_t one = 3 * 256 * f.row_bytes;
      if (cache)
        REQUIRE(s.err.find(" pinned experts of " + std::to_string(one) + " bytes, for " +
                           std::to_string(8 * one) + " expert bytes as held") != std::string::npos);
      else
        REQUIRE(s.err.find("1 slots for " + std::to_string(8 * one) + " expert bytes") !=
                std::string::npos);
    }
  }
}

TEST_CASE("cli: a damaged quantised expert is refused by the ring and the cache, naming it",
          "[cli][quantize][offload]") {
  test::ScratchDir dir("cli-quantised-experts-damaged");
  const std::string ckpt = test::train_on_fortunes(dir / "run", kModel);
  const std::string q4 = dir / "q4.h5", bad = dir / "bad.h5";
  must_run("moe-convert", "quantize " + ckpt + " --type q4_k -o " + q4);
  // Expert 2 of layer 1's w2, row 3: its one q4_k block's d (the block's first 2 bytes) an f16
  // infinity.
  io::Checkpoint c = io::load_checkpoint(q4);
  const std::string name = "blocks.1.moe.experts.w2";
  bool found = false;
  for (io::NamedTensor& nt : c.params) {
    if (nt.name != name) continue;
    REQUIRE(nt.tensor.shape() == Shape{4, 256, 144});
    nt.tensor = nt.tensor.clone();
    const uint16_t f16_inf = 0x7c00;
    std::memcpy(nt.tensor.data<uint8_t>() + (2 * 256 + 3) * 144, &f16_inf, 2);
    found = true;
  }
  REQUIRE(found);
  io::save_checkpoint(bad, c);
  const std::string score = "score --model " + bad + " --data " + test::fortunes_path("computers") +
                            " --max-sequences 6 --batch 3";
  // The resident model maps the experts and checks their scales only with --verify-weights; the
  // stores read each expert they hold, so they check it as the reading loader does.
  for (const std::string& flags : {std::string(" --expert-budget 60%"),
                                   std::string(" --expert-budget 100% --expert-cache lru")}) {
    INFO(flags);
    auto r = run_command(tool("moe-infer", score + flags));
    INFO(r.err);
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.err.find("moe-infer: error: ") != std::string::npos);
    REQUIRE(r.err.find("expert 2 of '" + name + "' row 3 block 0 has scale inf") !=
            std::string::npos);
    REQUIRE(r.err.find("the file is damaged") != std::string::npos);
  }
}
