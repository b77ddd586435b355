// Development check (make_golden.sh builds and runs it; not part of the build or the tests):
// moe's quantisers (backend/cpu/quant_blocks.h) against ggml's reference quantisers on 3000 rows
// of 4096 values from six distributions over eight decades of scale, far more blocks than the
// committed golden files hold. The K-quants' scale searches pick among near-equal candidates, so
// a change in the order of a sum shows up in about one row in 20 here and rarely in the golden
// rows. Exits 1 on any difference.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cpu/quant_blocks.h"
extern "C" {
#include "ggml.h"
// Q8_K is not a ggml_quantize_chunk type: its reference quantiser (ggml-quants.h).
void quantize_row_q8_K_ref(const float* x, void* y, int64_t k);
}

using moe::cpu::BlockFormat;

int main() {
  std::mt19937_64 gen(7);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(-1, 1);
  const int n = 4096, rows = 3000;
  const BlockFormat formats[] = {BlockFormat::q4_k, BlockFormat::q6_k, BlockFormat::mxfp4,
                                 BlockFormat::q8_k, BlockFormat::q8_0};
  const ggml_type types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_MXFP4, GGML_TYPE_Q8_K,
                             GGML_TYPE_Q8_0};
  long differ[5] = {0};
  std::vector<float> x(n);
  for (int r = 0; r < rows; ++r) {
    const float s = std::pow(10.0f, uniform(gen) * 4);
    for (int i = 0; i < n; ++i) {
      const float z = normal(gen);
      switch (r % 6) {
        case 0:
          x[i] = s * z;
          break;
        case 1:
          x[i] = s * z * std::fabs(z);
          break;  // heavy tails
        case 2:
          x[i] = s * std::round(z * 4) / 4;
          break;  // few distinct values
        case 3:
          x[i] = s * (std::fabs(z) + 0.1f);
          break;  // all positive
        case 4:
          x[i] = s * uniform(gen);
          break;  // uniform
        default:
          x[i] = s * z * (i % 7 == 0 ? 30.0f : 1.0f);  // outliers
      }
    }
    for (int f = 0; f < 5; ++f) {
      std::vector<uint8_t> ours(moe::cpu::block_row_bytes(formats[f], n)), theirs(ours.size(), 0);
      moe::cpu::quantize_row(formats[f], x.data(), n, ours.data());
      if (types[f] == GGML_TYPE_Q8_K)
        quantize_row_q8_K_ref(x.data(), theirs.data(), n);
      else
        ggml_quantize_chunk(types[f], x.data(), theirs.data(), 0, 1, n, nullptr);
      differ[f] += ours != theirs;
    }
  }
  long total = 0;
  for (int f = 0; f < 5; ++f) {
    std::printf("%-5s: %ld of %d rows differ from ggml\n", moe::cpu::block_format_name(formats[f]),
                differ[f], rows);
    total += differ[f];
  }
  return total == 0 ? 0 : 1;
}
