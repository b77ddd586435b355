// Fuzz target: token files (io::load_tokens) in the three formats, then the checks and the
// sampler a training run applies to them. The first byte picks the format (text, u16, u32); the
// rest is the file.
#include "fuzz.h"
#include "moe/io/dataset.h"
#include "moe/tensor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const char* const kNames[] = {"tokens.txt", "tokens.u16", "tokens.u32"};
  const std::string path =
      moe::fuzz::write_scratch(kNames[data[0] % 3], moe::fuzz::bytes_of(data + 1, size - 1));
  moe::fuzz::expect_clean([&] {
    std::vector<int32_t> tokens = moe::io::load_tokens(path);
    moe::fuzz::expect_clean([&] { moe::io::check_tokens_fit(tokens, 1000, path); });
    const int64_t seq = 1 + data[0] % 8;
    auto [train, val] = moe::io::split_tail(std::move(tokens), 0.1, seq);
    moe::io::BatchSampler sampler(&train, seq, 7);
    moe::Tensor inputs, targets;
    sampler.next(2, inputs, targets);
  });
  return 0;
}
