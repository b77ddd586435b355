// The two requests lm-evaluation-harness makes of a model: `loglikelihood` (the log-probability of
// a continuation given a context, and whether greedy decoding would produce it) and
// `loglikelihood_rolling` (a whole text's log-likelihood in windows of the model's context).
// moe-infer loglikelihood reads them as JSON lines.
//
// Shapes: T the model's context, V its vocabulary, B rows per forward pass.
#pragma once
#include <cstdint>
#include <functional>
#include <istream>
#include <string>
#include <vector>

#include "moe/io/tokenizer.h"
#include "moe/models/transformer.h"

namespace moe::comm {
class Communicator;
}

namespace moe::infer {

// One request as token ids: the continuation's tokens are scored given every token before them.
// A rolling request's continuation is its whole text and its context the token the harness starts
// from (prefix_token_id: the tokenizer's BOS, else its end-of-text token; empty when the model has
// neither: the text's first token is then not scored).
struct LoglikelihoodRequest {
  int64_t line = 0;  // in the request file, from 1 (blank lines counted)
  std::vector<int32_t> context, continuation;
};

// A request as lm-evaluation-harness tokenizes it: trailing whitespace of the context moves to
// the front of the continuation, the context is encoded, context + continuation is encoded whole,
// and the continuation's tokens are those of the whole past the context's (a tokenizer that
// merges across the boundary gives the continuation the merged token). An empty context is the
// harness's prefix token: the tokenizer's BOS, else its end-of-text token (moe::Error naming
// `where` when it has neither). Without a tokenizer, the text's bytes are its tokens.
LoglikelihoodRequest encode_request(const std::string& context, const std::string& continuation,
                                    const io::Tokenizer* tokenizer, const std::string& where);

// JSON lines of {"context": "...", "continuation": "..."} (rolling: {"text": "..."}); other keys
// are ignored (a benchmark's answer key may ride along), blank lines skipped. moe::Error naming
// `name`:LINE for a line that is not a JSON object, a missing or non-string field, an empty
// continuation (or text), token ids outside `vocab`, and (UsageError) a continuation of more
// than T tokens: it cannot be scored whole in the model's context.
std::vector<LoglikelihoodRequest> read_loglikelihood_requests(std::istream& in,
                                                              const std::string& name, bool rolling,
                                                              const io::Tokenizer* tokenizer,
                                                              int64_t vocab, int64_t seq);

struct LoglikelihoodResult {
  double logprob = 0;           // natural log, summed over the scored tokens
  bool greedy = true;           // every scored token the argmax (the first maximum) of its row
  int64_t tokens = 0;           // tokens scored
  int64_t context_dropped = 0;  // context tokens cut from the left to fit T
  int64_t windows = 0;          // forward-pass rows (rolling: the windows of the text)
};

// Scores the requests, B rows of equal length per forward pass (nothing is padded: a row's
// tokens see only their own request). A request of context + continuation is cut into
// lm-evaluation-harness's disjoint rolling windows: each predicts the next up to T continuation
// tokens from as much preceding text as fits T. A continuation of at most T tokens (all that
// read_loglikelihood_requests lets through without `rolling`) is one window: the request cut from
// the left to its last T + 1 tokens, keeping the continuation whole.
// progress (optional) sees the rows done, the rows in all and the input tokens so far after each
// pass.
// world (optional, --ep: the model's experts spread over its ranks): every rank calls this with
// the same requests (checked: moe::Error otherwise); a pass takes `batch` rows a rank, each rank
// computes its share (one without rows computes the pass's last and drops it: every rank runs
// every pass), and every rank gets every row's log-probabilities, added in one process's order.
std::vector<LoglikelihoodResult> loglikelihood(
    const Transformer& model, const std::vector<LoglikelihoodRequest>& requests, int64_t batch,
    const std::function<void(int64_t done, int64_t total, int64_t tokens)>& progress = {},
    comm::Communicator* world = nullptr);

}  // namespace moe::infer
