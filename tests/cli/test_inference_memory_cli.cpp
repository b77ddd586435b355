// Inference holds activations of one block at a time, attention by blocks of query rows and the
// LM head's logits by blocks of rows (issue 43): moe-infer score of a model whose context is long
// runs under an address-space limit (RLIMIT_AS, `ulimit -v`) of what scoring a short-context
// model of the same widths needs plus 128 MB, where the [B,H,T,T] attention probabilities alone
// would take 512 MB (16 heads, 2,048 tokens, 2 layers: 256 MB a layer), and scores what it
// scores without the limit. One thread: the BLAS maps a buffer for each thread that calls it, and
// whether the short model's products are large enough to run on several threads is the BLAS's
// business, not what this test measures.
#include <catch2/catch.hpp>
#include <filesystem>

#include "moe/io/checkpoint.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;

namespace {

ModelConfig model_config(int64_t seq) {
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.d_model = 64;
  c.heads = 16;  // head dim 4
  c.kv_heads = 4;
  c.seq = seq;
  c.resolve();
  return c;
}

// A checkpoint of the model and a token file of two windows of its context (u16 ids).
void write_case(const test::ScratchDir& dir, const std::string& name, int64_t seq) {
  const ModelConfig c = model_config(seq);
  io::save_checkpoint(dir / (name + ".h5"), test::initial_checkpoint(c, 3));
  std::string ids;
  for (int64_t i = 0; i < 2 * seq + 1; ++i) {
    const auto id = static_cast<uint16_t>((i * 7919) % c.vocab_size);
    ids.push_back(static_cast<char>(id & 0xff));
    ids.push_back(static_cast<char>(id >> 8));
  }
  test::write_file(dir / (name + ".u16"), ids);
}

std::string score(const test::ScratchDir& dir, const std::string& name) {
  return tool("moe-infer", "score --model " + (dir / (name + ".h5")) + " --data " +
                               (dir / (name + ".u16")) + " --batch 1 --threads 1 -q");
}

}  // namespace

TEST_CASE("cli: scoring a long context runs in bounded activation memory", "[cli][infer][memory]") {
  if (test::kAddressSanitizer) {
    WARN("AddressSanitizer build: no address-space limit can be set; the Release pass runs this");
    return;
  }
  test::ScratchDir dir("cli-inference-memory");
  write_case(dir, "short", 64);
  write_case(dir, "long", 2048);
  const ModelConfig long_config = model_config(2048);
  const int64_t probs_bytes = long_config.layers * long_config.heads * 2048 * 2048 * 4;
  const int64_t headroom = int64_t(128) << 20;
  REQUIRE(probs_bytes >= 4 * headroom);
  const int64_t limit = test::smallest_address_space(score(dir, "short")) + headroom;
  const auto free_run = run_command(score(dir, "long"));
  INFO(free_run.err);
  REQUIRE(free_run.exit_code == 0);
  REQUIRE(free_run.out.find("\"ppl\"") != std::string::npos);
  // A limit that leaves the BLAS short can leave it retrying an allocation forever: bounded.
  const auto limited =
      run_command(test::under_limit(limit, "timeout -s KILL 300 " + score(dir, "long")));
  INFO(limited.err);
  REQUIRE(limited.exit_code == 0);
  REQUIRE(limited.out == free_run.out);
}
