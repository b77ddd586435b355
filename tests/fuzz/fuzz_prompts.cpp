// Fuzz target: moe-infer generate's prompt files (infer::read_prompts), for a byte-level model
// and, chosen by the first byte, for a model whose vocabulary is too small for text prompts.
#include <sstream>

#include "fuzz.h"
#include "moe/infer/prompts.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int64_t vocab = data[0] % 2 ? 256 : 100;
  std::istringstream in(moe::fuzz::bytes_of(data + 1, size - 1));
  moe::fuzz::expect_clean([&] { moe::infer::read_prompts(in, "fuzz.jsonl", {}, vocab); });
  return 0;
}
