// Shapes: T the model's context, V its vocabulary, B rows per forward pass, L a row's length.
#include "moe/infer/loglikelihood.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "moe/checksum.h"
#include "moe/comm/communicator.h"
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

// One input position of a row after a pass: its target's log-probability and whether it is the
// greedy token, or nothing (a context position: not scored). Two i64 words between ranks: the
// log-probability's double bits, then the flags.
struct Position {
  double logprob = 0;
  bool scored = false, greedy = false;
};

// Rows [first, first + count) of `order` (all of length L) through one forward pass: L positions
// a row, in row order. count 0: a rank without rows under --ep computes row `first` (every rank
// runs every pass) and returns nothing.
std::vector<Position> pass_positions(const Transformer& model,
                                     const std::vector<LoglikelihoodRequest>& requests,
                                     const std::vector<Row>& rows, const std::vector<size_t>& order,
                                     size_t first, size_t count) {
  const int64_t length = rows[order[first]].length(), b = std::max<int64_t>(1, int64_t(count));
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
  std::vector<Position> out(count * static_cast<size_t>(length));
  EvalOptions options;
  options.logit_rows = [&](const Tensor& logits, int64_t from) {
    const Tensor host = logits.to(Device{});
    const int64_t vocab = host.dim(1);
    for (int64_t k = 0; k < host.dim(0) && from + k < static_cast<int64_t>(out.size()); ++k) {
      const int32_t target = targets.data<int32_t>()[from + k];
      if (target < 0) continue;
      const TokenLogprob t = token_logprob(host.data<float>() + k * vocab, vocab, target);
      out[static_cast<size_t>(from + k)] = Position{t.logprob, true, t.greedy};
    }
  };
  model.evaluate(ids.to(model.device()), targets.to(model.device()), options);
  return out;
}

// Under --ep: every rank's positions of a round, in row order (rank q computed counts[q] rows of
// `length`), on every rank: each position's values as the rank that computed it had them.
std::vector<Position> gather_positions(comm::Communicator& world, const std::vector<Position>& mine,
                                       const std::vector<int64_t>& counts, int64_t length) {
  Tensor send = Tensor::empty({static_cast<int64_t>(mine.size()) * 2}, DType::i64);
  int64_t* out = send.data<int64_t>();
  for (const Position& p : mine) {
    std::memcpy(out++, &p.logprob, sizeof(double));
    *out++ = int64_t(p.scored) | int64_t(p.greedy) << 1;
  }
  std::vector<int64_t> words;
  int64_t total = 0;
  for (int64_t c : counts) words.push_back(c * length * 2), total += c * length;
  Tensor all = Tensor::empty({total * 2}, DType::i64);
  world.all_gatherv(send, all, words);
  std::vector<Position> positions(static_cast<size_t>(total));
  const int64_t* in = all.data<int64_t>();
  for (Position& p : positions) {
    std::memcpy(&p.logprob, in++, sizeof(double));
    p.scored = (*in & 1) != 0, p.greedy = (*in & 2) != 0;
    ++in;
  }
  return positions;
}

// The positions of rows [first, first + count) of `order` added to their requests' results, in
// row order, token by token (the order of one process's sums under --ep too). Checked after the
// pass: no result is printed as "nan".
void add_positions(const std::vector<LoglikelihoodRequest>& requests, const std::vector<Row>& rows,
                   const std::vector<size_t>& order, size_t first, size_t count,
                   const std::vector<Position>& positions,
                   std::vector<LoglikelihoodResult>& results) {
  const int64_t length = rows[order[first]].length();
  MOE_CHECK(positions.size() == count * static_cast<size_t>(length),
            "loglikelihood: ", positions.size(), " positions for ", count, " rows of ", length);
  const LoglikelihoodRequest* non_finite = nullptr;  // the first request given a non-finite one
  for (size_t i = 0; i < positions.size(); ++i) {
    const Position& p = positions[i];
    if (!p.scored) continue;
    const Row& row = rows[order[first + i / static_cast<size_t>(length)]];
    LoglikelihoodResult& out = results[row.request];
    if (!std::isfinite(p.logprob) && !non_finite) non_finite = &requests[row.request];
    out.logprob += p.logprob;
    out.greedy = out.greedy && p.greedy;
    ++out.tokens;
  }
  if (non_finite)
    throw NonFiniteOutput(
        str("the request on line ", non_finite->line,
            ": a log-probability of its continuation is not finite: the model computes "
            "non-finite logits from its weights (were they trained with a learning rate "
            "too high?); no result is given"));
}

// Under --ep every rank must score the same requests (each reads its own copy of the file).
void check_requests_agree(comm::Communicator& world,
                          const std::vector<LoglikelihoodRequest>& requests) {
  uint32_t crc = 0;
  int64_t tokens = 0;
  for (const LoglikelihoodRequest& r : requests)
    for (const std::vector<int32_t>* part : {&r.context, &r.continuation}) {
      const auto n = static_cast<int64_t>(part->size());
      crc = crc32c(&n, sizeof n, crc);
      crc = crc32c(part->data(), part->size() * sizeof(int32_t), crc);
      tokens += n;
    }
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", crc);
  world.check_same_everywhere(
      "the loglikelihood request file (its token ids)",
      str(requests.size(), " requests, ", tokens, " tokens, CRC-32C ", hex));
}

}  // namespace

std::vector<LoglikelihoodResult> loglikelihood(
    const Transformer& model, const std::vector<LoglikelihoodRequest>& requests, int64_t batch,
    const std::function<void(int64_t done, int64_t total, int64_t tokens)>& progress,
    comm::Communicator* world) {
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
  // Under --ep a pass takes batch rows a rank; rank q computes its contiguous share of them.
  const int R = world ? world->size() : 1, me = world ? world->rank() : 0;
  if (R > 1) check_requests_agree(*world, requests);
  int64_t tokens = 0;
  for (size_t first = 0; first < order.size();) {
    size_t count = 1;
    while (first + count < order.size() && static_cast<int64_t>(count) < batch * R &&
           rows[order[first + count]].length() == rows[order[first]].length())
      ++count;
    const size_t per = (count + size_t(R) - 1) / size_t(R);
    auto share = [&](int q) { return std::min(count, size_t(q) * per); };  // rank q's first row
    std::vector<Position> positions =
        pass_positions(model, requests, rows, order, first + std::min(share(me), count - 1),
                       share(me + 1) - share(me));
    if (R > 1) {
      std::vector<int64_t> counts;
      for (int q = 0; q < R; ++q) counts.push_back(int64_t(share(q + 1) - share(q)));
      positions = gather_positions(*world, positions, counts, rows[order[first]].length());
    }
    add_positions(requests, rows, order, first, count, positions, results);
    tokens += rows[order[first]].length() * static_cast<int64_t>(count);
    first += count;
    if (progress) progress(static_cast<int64_t>(first), static_cast<int64_t>(order.size()), tokens);
  }
  return results;
}

}  // namespace moe::infer
