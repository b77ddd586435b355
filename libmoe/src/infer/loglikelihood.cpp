// Shapes: T the model's context, V its vocabulary, B rows per forward pass, L a row's length.
#include "moe/infer/loglikelihood.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "moe/error.h"
#include "moe/infer/model.h"
#include "moe/infer/token_logprobs.h"

namespace moe::infer {

namespace {

// One forward-pass row: the input tokens [start, end - 1) of its request's context +
// continuation, predicting tokens [start + 1, end), of which those from `scored` on count.
struct Row {
  size_t request = 0;
  int64_t start = 0, end = 0, scored = 0;
  int64_t length() const { return end - 1 - start; }
};

// lm-evaluation-harness's rolling windows (get_rolling_token_windows with a context of one
// token, made disjoint): each predicts the next up to T tokens from the last T before them.
void add_rows(size_t request, const LoglikelihoodRequest& r, int64_t seq, std::vector<Row>& rows) {
  const auto total = static_cast<int64_t>(r.context.size() + r.continuation.size());
  for (int64_t next = std::max<int64_t>(1, static_cast<int64_t>(r.context.size())); next < total;) {
    const int64_t end = std::min(total, next + seq);
    rows.push_back(Row{request, std::max<int64_t>(0, end - 1 - seq), end, next});
    next = end;
  }
}

int32_t token_at(const LoglikelihoodRequest& r, int64_t i) {
  const auto c = static_cast<int64_t>(r.context.size());
  return i < c ? r.context[static_cast<size_t>(i)] : r.continuation[static_cast<size_t>(i - c)];
}

// Rows [first, first + count) of `order` (all of length L) through one forward pass, their
// scored tokens' log-probabilities added to their requests' results.
void score_rows(const Transformer& model, const std::vector<LoglikelihoodRequest>& requests,
                const std::vector<Row>& rows, const std::vector<size_t>& order, size_t first,
                size_t count, std::vector<LoglikelihoodResult>& results) {
  const int64_t length = rows[order[first]].length(), b = static_cast<int64_t>(count);
  Tensor ids = Tensor::empty({b, length}, DType::i32);
  Tensor targets = Tensor::empty({b, length}, DType::i32);
  for (int64_t i = 0; i < b; ++i) {
    const Row& row = rows[order[first + static_cast<size_t>(i)]];
    const LoglikelihoodRequest& r = requests[row.request];
    for (int64_t j = 0; j < length; ++j) {
      ids.data<int32_t>()[i * length + j] = token_at(r, row.start + j);
      const int64_t target = row.start + j + 1;
      targets.data<int32_t>()[i * length + j] = target >= row.scored ? token_at(r, target) : -1;
    }
  }
  EvalOptions options;
  const LoglikelihoodRequest* non_finite = nullptr;  // the first request given a non-finite one
  options.logit_rows = [&](const Tensor& logits, int64_t from) {
    const Tensor host = logits.to(Device{});
    const int64_t vocab = host.dim(1);
    for (int64_t k = 0; k < host.dim(0); ++k) {
      const int32_t target = targets.data<int32_t>()[from + k];
      if (target < 0) continue;
      const Row& row = rows[order[first + static_cast<size_t>((from + k) / length)]];
      LoglikelihoodResult& out = results[row.request];
      const TokenLogprob t = token_logprob(host.data<float>() + k * vocab, vocab, target);
      if (!std::isfinite(t.logprob) && !non_finite) non_finite = &requests[row.request];
      out.logprob += t.logprob;
      out.greedy = out.greedy && t.greedy;
      ++out.tokens;
    }
  };
  model.evaluate(ids.to(model.device()), targets.to(model.device()), options);
  // Checked after the pass (not thrown from inside it): no result is printed as "nan".
  if (non_finite)
    throw NonFiniteOutput(str("the request on line ", non_finite->line,
                    ": a log-probability of its continuation is not finite: the model computes "
                    "non-finite logits from its weights (were they trained with a learning rate "
                    "too high?); no result is given"));
}

}  // namespace

std::vector<LoglikelihoodResult> loglikelihood(
    const Transformer& model, const std::vector<LoglikelihoodRequest>& requests, int64_t batch,
    const std::function<void(int64_t done, int64_t total, int64_t tokens)>& progress) {
  MOE_CHECK(batch > 0, "loglikelihood: ", batch, " rows a pass");
  const int64_t seq = model.config().seq;
  std::vector<Row> rows;
  std::vector<LoglikelihoodResult> results(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const size_t before = rows.size();
    add_rows(i, requests[i], seq, rows);
    results[i].windows = static_cast<int64_t>(rows.size() - before);
    if (rows.size() > before) results[i].context_dropped = rows[before].start;
  }
  // Rows of equal length share a pass (in request order among them): no padding.
  std::vector<size_t> order(rows.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rows[a].length() < rows[b].length(); });
  int64_t tokens = 0;
  for (size_t first = 0; first < order.size();) {
    size_t count = 1;
    while (first + count < order.size() && static_cast<int64_t>(count) < batch &&
           rows[order[first + count]].length() == rows[order[first]].length())
      ++count;
    score_rows(model, requests, rows, order, first, count, results);
    tokens += rows[order[first]].length() * static_cast<int64_t>(count);
    first += count;
    if (progress) progress(static_cast<int64_t>(first), static_cast<int64_t>(order.size()), tokens);
  }
  return results;
}

}  // namespace moe::infer
