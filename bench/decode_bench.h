// moe-bench --decode: a Mixtral-shaped model's decode and prefill speed per weight dtype against
// the memory-bandwidth bound measured in the same run (bench/decode_bench.cpp).
#pragma once
#include <string>
#include <vector>

namespace moe::bench {

struct DecodeOptions {
  bool quick = false;
  int threads = 0;           // 0: the library default
  double min_seconds = 1.0;  // per measurement
  std::vector<std::string> dtypes = {"f32", "bf16", "f16", "q8_0"};
};

int run_decode(const DecodeOptions& options);

}  // namespace moe::bench
