// Shapes: V the vocabulary, n the alternatives asked for.
#include "moe/infer/token_logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "moe/error.h"

namespace moe::infer {

TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t id, int64_t top) {
  MOE_CHECK(vocab > 0 && id >= 0 && id < vocab, "token_logprob: token ", id,
            " outside the vocabulary of ", vocab);
  MOE_CHECK(top >= 0 && top <= vocab, "token_logprob: top ", top, " of a vocabulary of ", vocab);
  int64_t first_max = 0;
  for (int64_t v = 1; v < vocab; ++v)
    if (logits[v] > logits[first_max]) first_max = v;
  const double max = logits[first_max];
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(logits[v]) - max);
  const double log_z = max + std::log(sum);
  TokenLogprob t;
  t.id = id;
  t.logprob = double(logits[id]) - log_z;
  t.greedy = first_max == id;
  for (int64_t v = 0; v < vocab; ++v) t.rank += logits[v] > logits[id];
  if (top == 0) return t;
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + top, order.end(), before);
  for (int64_t i = 0; i < top; ++i) {
    t.top_ids.push_back(order[static_cast<size_t>(i)]);
    t.top_logprobs.push_back(double(logits[order[static_cast<size_t>(i)]]) - log_z);
  }
  return t;
}

}  // namespace moe::infer
