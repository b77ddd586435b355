// Shapes: T the model's context, R ranks, B windows per rank and forward pass.
#include "moe/infer/score.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "moe/arena.h"
#include "moe/checksum.h"
#include "moe/io/dataset.h"
#include "moe/io/model_text.h"
#include "moe/models/memory.h"
#include "moe/nn/loss.h"
#include "moe/settings.h"
#include "moe/timer.h"

namespace moe::infer {

namespace {

// Windows [first, first + count) of the file (window w: tokens w*T .. w*T+T, as training
// evaluation cuts them): ids and targets [count, T].
void windows_of(const std::vector<int32_t>& tokens, int64_t seq, int64_t first, int64_t count,
                Tensor& ids, Tensor& targets) {
  ids = Tensor::empty({count, seq}, DType::i32);
  targets = Tensor::empty({count, seq}, DType::i32);
  for (int64_t w = 0; w < count; ++w) {
    const int32_t* src = tokens.data() + (first + w) * seq;
    std::copy(src, src + seq, ids.data<int32_t>() + w * seq);
    std::copy(src + 1, src + seq + 1, targets.data<int32_t>() + w * seq);
  }
}

// The log-probabilities of the targets (host [rows]) of logit rows [first, first + rows) of a
// pass whose row i is position i % seq of window i / seq, appended to that window's list (rows of
// windows past per_window's are a rank's filler, skipped). Blocks arrive in row order.
void add_token_logprobs(const Tensor& logits, int64_t first, const int32_t* targets, int64_t seq,
                        int64_t top, std::vector<std::vector<TokenLogprob>>& per_window) {
  const Tensor host = logits.to(Device{});
  const int64_t vocab = host.dim(1);
  for (int64_t i = 0; i < host.dim(0); ++i) {
    const auto w = static_cast<size_t>((first + i) / seq);
    if (w >= per_window.size()) break;
    per_window[w].push_back(
        token_logprob(host.data<float>() + i * vocab, vocab, targets[first + i], top));
  }
}

// Per-window NLL sums of windows [first, first + count) through the KV cache, a token at a time
// (and with per_token non-null, each window's token log-probabilities).
std::vector<double> incremental_sums(const Engine& e, const std::vector<int32_t>& tokens,
                                     int64_t first, int64_t count, KVCache& cache, Arena& arena,
                                     int64_t top,
                                     std::vector<std::vector<TokenLogprob>>* per_token) {
  const int64_t seq = e.config().seq;
  std::vector<double> sums(static_cast<size_t>(count), 0.0);
  cache.clear();
  std::vector<int32_t> ids(static_cast<size_t>(count)), next(static_cast<size_t>(count));
  for (int64_t t = 0; t < seq; ++t) {
    {
      ArenaScope scope(arena);
      for (int64_t w = 0; w < count; ++w) {
        ids[static_cast<size_t>(w)] = tokens[static_cast<size_t>((first + w) * seq + t)];
        next[static_cast<size_t>(w)] = tokens[static_cast<size_t>((first + w) * seq + t + 1)];
      }
      const Tensor logits =
          e.model().forward_cached(Tensor::from_vector({count, 1}, ids).to(e.device()), cache);
      Tensor row_nll;
      nn::cross_entropy(logits, Tensor::from_vector({count}, next).to(e.device()), nullptr, 1.0f,
                        &row_nll);
      row_nll = row_nll.to(Device{});
      for (int64_t w = 0; w < count; ++w) sums[static_cast<size_t>(w)] += row_nll.data<float>()[w];
      if (per_token) add_token_logprobs(logits, 0, next.data(), 1, top, *per_token);
    }
    arena.reset();
  }
  return sums;
}

// Per-window NLL sums of windows [first, first + count) in one forward pass (count 0: a rank
// without windows under --ep computes window `first` and drops it), and with per_token non-null
// each window's token log-probabilities, from the logits as the head makes them.
std::vector<double> full_pass_sums(const Engine& e, const std::vector<int32_t>& tokens,
                                   int64_t first, int64_t count, Arena& arena, int64_t top,
                                   std::vector<std::vector<TokenLogprob>>* per_token) {
  const int64_t seq = e.config().seq;
  std::vector<double> sums(static_cast<size_t>(count));
  ArenaScope scope(arena);
  Tensor ids, targets, row_nll;
  windows_of(tokens, seq, first, std::max<int64_t>(count, 1), ids, targets);
  EvalOptions eval;
  eval.row_nll = &row_nll;
  if (per_token)
    eval.logit_rows = [&](const Tensor& logits, int64_t from) {
      add_token_logprobs(logits, from, targets.data<int32_t>(), seq, top, *per_token);
    };
  e.model().evaluate(ids.to(e.device()), targets.to(e.device()), eval);
  row_nll = row_nll.to(Device{});
  const float* nll = row_nll.data<float>();
  for (int64_t s = 0; s < count; ++s) {
    double sum = 0;
    for (int64_t t = 0; t < seq; ++t) sum += nll[s * seq + t];
    sums[static_cast<size_t>(s)] = sum;
  }
  arena.reset();
  return sums;
}

// Under --ep: every rank's per-token records of a round, gathered in window order (rank q holds
// counts[q] windows of `seq` tokens). A token travels as 4 + 2 top i64 words: id, log-prob (its
// double's bits), rank, greedy, then its top ids and their log-probs' bits, so rank 0 prints what
// the rank that computed it did.
void gather_token_logprobs(comm::Communicator& world, int64_t seq, int64_t top,
                           const std::vector<int64_t>& counts,
                           std::vector<std::vector<TokenLogprob>>& per_token) {
  const int64_t words = 4 + 2 * top;
  auto bits = [](double x) {
    int64_t b;
    std::memcpy(&b, &x, sizeof b);
    return b;
  };
  Tensor send = Tensor::empty({static_cast<int64_t>(per_token.size()) * seq * words}, DType::i64);
  int64_t* out = send.data<int64_t>();
  for (const std::vector<TokenLogprob>& window : per_token) {
    MOE_CHECK(static_cast<int64_t>(window.size()) == seq, "score: a window of ", window.size(),
              " token log-probs (expected ", seq, ")");
    for (const TokenLogprob& t : window) {
      *out++ = t.id, *out++ = bits(t.logprob), *out++ = t.rank, *out++ = t.greedy;
      for (int64_t i = 0; i < top; ++i) *out++ = t.top_ids[static_cast<size_t>(i)];
      for (int64_t i = 0; i < top; ++i) *out++ = bits(t.top_logprobs[static_cast<size_t>(i)]);
    }
  }
  std::vector<int64_t> word_counts;
  int64_t windows = 0;
  for (int64_t c : counts) word_counts.push_back(c * seq * words), windows += c;
  Tensor all = Tensor::empty({windows * seq * words}, DType::i64);
  world.all_gatherv(send, all, word_counts);
  const int64_t* in = all.data<int64_t>();
  auto value = [](int64_t b) {
    double x;
    std::memcpy(&x, &b, sizeof x);
    return x;
  };
  per_token.assign(static_cast<size_t>(windows),
                   std::vector<TokenLogprob>(static_cast<size_t>(seq)));
  for (std::vector<TokenLogprob>& window : per_token)
    for (TokenLogprob& t : window) {
      t.id = static_cast<int32_t>(in[0]), t.logprob = value(in[1]), t.rank = in[2];
      t.greedy = in[3] != 0;
      in += 4;
      for (int64_t i = 0; i < top; ++i) t.top_ids.push_back(static_cast<int32_t>(*in++));
      for (int64_t i = 0; i < top; ++i) t.top_logprobs.push_back(value(*in++));
    }
}

// A window whose log-likelihood is NaN or infinite has no score: the model's weights give
// non-finite logits (a training run that diverged without a NaN, say: --lr 1e30 leaves weights
// of 1e28 that every check of finite values passes). Refused rather than printed as "nan".
void check_scores_finite(const std::vector<double>& sums, int64_t first, int64_t seq,
                         const std::string& data) {
  for (size_t s = 0; s < sums.size(); ++s) {
    if (std::isfinite(sums[s])) continue;
    const int64_t w = first + static_cast<int64_t>(s);
    throw NonFiniteOutput(str("window ", w, " of '", data, "' (tokens ", w * seq, "..", w * seq + seq,
                    "): its log-likelihood is ", std::isnan(sums[s]) ? "NaN" : "infinite",
                    ": the model computes non-finite logits from its weights (were they "
                    "trained with a learning rate too high?); no score is given"));
  }
}

}  // namespace

ScoreSummary score(const Engine& e, const ScoreOptions& o, const ScoreCallbacks& callbacks) {
  const ModelConfig& mc = e.config();
  const int R = e.ranks(), r = e.rank();
  const io::TokenFormat format =
      io::resolve_token_format(o.data, o.data_format);
  std::vector<int32_t> tokens = io::load_model_tokens(o.data, format, o.tokenizer);
  if (R > 1) {  // ranks reading other files (or one through another tokenizer) would misalign
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", crc32c(tokens.data(), tokens.size() * sizeof(int32_t)));
    e.world()->check_same_everywhere(
        "the data to score (its tokens, as its format and tokenizer read them)",
        str(tokens.size(), " tokens, CRC-32C ", crc));
  }
  io::check_tokens_fit(tokens, mc.vocab_size, o.data);
  if (static_cast<int64_t>(tokens.size()) < mc.seq + 1)
    throw Error(str(o.data, ": ", tokens.size(), " tokens, fewer than one sequence of ", mc.seq + 1,
                    " (the model's context + 1)"));
  int64_t total = (static_cast<int64_t>(tokens.size()) - 1) / mc.seq;
  if (o.max_sequences > 0) total = std::min(total, o.max_sequences);
  MOE_USAGE_CHECK(!o.incremental || R == 1, "score ", flag_for(Setting::incremental),
                  " runs in one process (not under ", flag_for(Setting::ep), " with ", R,
                  " ranks)");
  MOE_USAGE_CHECK(o.top >= 0 && o.top <= mc.vocab_size, "score: top ", o.top,
                  " alternatives of a vocabulary of ", mc.vocab_size);
  if (!o.incremental)  // before the first pass sizes anything by the batch
    check_inference_activations(
        mc, std::min(o.batch, total),
        str("scoring ", std::min(o.batch, total), " windows of ", mc.seq, " tokens a pass"),
        "a smaller batch needs less");
  if (callbacks.start) callbacks.start(total);
  ScoreSummary summary;
  summary.sequences = total;
  Arena arena;
  // The cache lives outside the arena (its tensors outlast every step's scope).
  KVCache cache = o.incremental ? e.model().make_cache(o.batch) : KVCache{};
  Timer timer;
  // Each round takes batch x R windows; rank r computes its contiguous share (under --ep every
  // rank must run every forward pass, so a rank without windows computes window 0 and drops it).
  for (int64_t done = 0; done < total;) {
    Timer batch_timer;
    const int64_t round = std::min(o.batch * R, total - done);
    const int64_t per = (round + R - 1) / R;
    const int64_t begin = std::min(round, r * per), mine = std::min(round, (r + 1) * per) - begin;
    std::vector<double> sums(static_cast<size_t>(mine));
    std::vector<std::vector<TokenLogprob>> per_token(o.per_token ? static_cast<size_t>(mine) : 0);
    if (o.incremental) {
      sums = incremental_sums(e, tokens, done, mine, cache, arena, o.top,
                              o.per_token ? &per_token : nullptr);
    } else {
      sums = full_pass_sums(e, tokens, mine ? done + begin : 0, mine, arena, o.top,
                            o.per_token ? &per_token : nullptr);
    }
    if (R > 1) {  // rank 0 gathers the round's sums (as their bits), in window order
      std::vector<int64_t> counts(static_cast<size_t>(R));
      for (int q = 0; q < R; ++q)
        counts[static_cast<size_t>(q)] = std::min(round, (q + 1) * per) - std::min(round, q * per);
      Tensor send = Tensor::empty({mine}, DType::i64), all = Tensor::empty({round}, DType::i64);
      if (mine > 0) std::memcpy(send.raw(), sums.data(), sums.size() * sizeof(double));
      e.world()->all_gatherv(send, all, counts);
      sums.resize(static_cast<size_t>(round));
      std::memcpy(sums.data(), all.raw(), sums.size() * sizeof(double));
      if (o.per_token) gather_token_logprobs(*e.world(), mc.seq, o.top, counts, per_token);
    }
    check_scores_finite(sums, done, mc.seq, o.data);  // every rank holds the round's sums
    for (size_t s = 0; s < sums.size() && r == 0; ++s) {
      summary.nll_sum += sums[s];
      summary.predicted += mc.seq;
      if (!callbacks.sequence) continue;
      SequenceScore window{done + static_cast<int64_t>(s), mc.seq, sums[s], {}};
      if (o.per_token) window.per_token = std::move(per_token[s]);
      callbacks.sequence(window);
    }
    done += round;
    summary.batch_seconds.push_back(batch_timer.seconds());
    if (callbacks.progress) callbacks.progress(done, total);
  }
  summary.seconds = timer.seconds();
  return summary;
}

}  // namespace moe::infer
