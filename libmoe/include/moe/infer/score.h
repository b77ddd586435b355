// Scoring a token file with an inference engine: the log-likelihood of every window of the
// model's context, as training evaluation cuts them (moe-infer score).
//
// Shapes: T the model's context, R ranks of the engine, B windows per rank and forward pass.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moe/infer/engine.h"
#include "moe/infer/token_logprobs.h"
#include "moe/io/dataset.h"
#include "moe/io/tokenizer.h"

namespace moe::infer {

struct ScoreOptions {
  std::string data;  // text or .u16/.u32 token file (io::load_tokens)
  io::TokenFormat data_format = io::TokenFormat::automatic;
  int64_t batch = 8;          // B
  int64_t max_sequences = 0;  // 0: every window of the file
  // Text data is encoded by this tokenizer (no BOS: windows cut a stream); null: a text file's
  // bytes are its tokens, which only a byte-level model (vocabulary 256) reads.
  const io::Tokenizer* tokenizer = nullptr;
  // Score through the decode path: each window's tokens one at a time through the KV cache
  // (Transformer::forward_cached), the round's B windows as B cache slots, so every product has
  // at most B rows (the decode GEMV's when B <= 8) instead of B x T. The scores equal the full
  // pass's up to float rounding, except where a kernel differs by design at few rows (Q8_0 weights
  // multiply 8-bit inputs there, backend/cpu/gemv.h): this is how to measure what a generation
  // sees. One process (not under --ep).
  bool incremental = false;
  // Each window's tokens one by one (SequenceScore::per_token), with the `top` most likely tokens
  // at each position (0: none). Under --ep each rank's windows' tokens are gathered to every
  // rank (rank 0 reports them).
  bool per_token = false;
  int64_t top = 0;
};

// One window w: tokens w*T .. w*T+T predicting w*T+1 .. w*T+T+1.
struct SequenceScore {
  int64_t index = 0, tokens = 0;
  double nll_sum = 0;  // summed over the window's T predicted tokens, in position order
  // With ScoreOptions::per_token: the T predicted tokens in order (their log-probabilities sum to
  // -nll_sum up to float rounding: the loss kernel works in float, these in double).
  std::vector<TokenLogprob> per_token;
};

struct ScoreCallbacks {
  std::function<void(int64_t total)> start;  // the windows to score, once the data is checked
  std::function<void(const SequenceScore&)> sequence;         // rank 0, in window order
  std::function<void(int64_t done, int64_t total)> progress;  // after each round
};

struct ScoreSummary {
  int64_t sequences = 0;              // windows scored
  int64_t predicted = 0;              // tokens predicted (rank 0's count; 0 on other ranks)
  double nll_sum = 0;                 // over them (rank 0)
  double seconds = 0;                 // from the first round to the last
  std::vector<double> batch_seconds;  // per round
};

// Scores the windows of options.data. Each round takes B x R windows; rank r computes its
// contiguous share and rank 0 gathers the sums (as their bits, so they are the ones one rank
// computes). Collective over the engine's world. Error naming the file when its tokens do not fit
// the model's vocabulary or make less than one window of T + 1.
ScoreSummary score(const Engine& engine, const ScoreOptions& options,
                   const ScoreCallbacks& callbacks);

}  // namespace moe::infer
