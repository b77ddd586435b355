// Greedy continuations that a test can compare token for token: each step's choice must win by a
// margin (relative to the logits' scale) that the rounding of the path under test cannot
// overturn, so that a tie decided either way never fails a test, nor hides a defect.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace moe::test {

// The arg-max of one position's V logits; REQUIREs that it beats the runner-up by `margin` times
// the largest |logit| (1e-4 where the path rounds to ~1e-6 of that scale).
template <class Scalar>
int32_t clear_argmax(const Scalar* last, int64_t V, int step, double margin = 1e-4) {
  const int32_t best = static_cast<int32_t>(std::max_element(last, last + V) - last);
  double second = -INFINITY, scale = 0;
  for (int64_t v = 0; v < V; ++v) {
    scale = std::max(scale, std::fabs(double(last[v])));
    if (v != best) second = std::max(second, double(last[v]));
  }
  INFO("step " << step << ": top two logits " << last[best] << " and " << second);
  REQUIRE(double(last[best]) - second > margin * scale);
  return best;
}

// `ids` continued by `n` tokens: `logits_of(ids)` gives the logits of every position ([T, V],
// row-major, any floating type) and the last row's clear arg-max is appended.
template <class LogitsOf>
std::vector<int32_t> clear_greedy(std::vector<int32_t> ids, int n, int64_t V, LogitsOf logits_of) {
  std::vector<int32_t> out;
  for (int step = 0; step < n; ++step) {
    const auto logits = logits_of(ids);
    const int64_t T = static_cast<int64_t>(ids.size());
    REQUIRE(static_cast<int64_t>(logits.size()) == T * V);
    const int32_t best = clear_argmax(logits.data() + (T - 1) * V, V, step);
    out.push_back(best);
    ids.push_back(best);
  }
  return out;
}

}  // namespace moe::test
