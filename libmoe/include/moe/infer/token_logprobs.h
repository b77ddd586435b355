// The log-probability of a token under one row of logits, with its rank and the row's most likely
// tokens: what evaluation harnesses ask of a model (moe-infer score --per-token, loglikelihood).
//
// Shapes: V the vocabulary (the model's, padding included), n the alternatives asked for.
#pragma once
#include <cstdint>
#include <vector>

namespace moe::infer {

struct TokenLogprob {
  int32_t id = 0;       // the token scored
  double logprob = 0;   // natural log of its softmax probability (log-softmax in double)
  int64_t rank = 1;     // 1 + the tokens whose logit is strictly greater (ties rank together)
  bool greedy = false;  // it is the argmax: the first maximum, as greedy generation picks it
  std::vector<int32_t> top_ids;      // the n most likely tokens, most likely first (ties: lower id)
  std::vector<double> top_logprobs;  // their log-probabilities
};

// Token `id` of the row `logits` [V] (host f32), with the `top` most likely tokens (0: none; at
// most V). The log-softmax is taken in double: max + log(sum(exp(logit - max))).
TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t id, int64_t top = 0);

}  // namespace moe::infer
