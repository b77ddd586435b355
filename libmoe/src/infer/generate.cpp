// Batched generation: per batch of prompts, a ragged prefill then one decode step per new token,
// every row at its own position in its own KV cache slot. Sampling per row from Philox keyed by
// (seed, prompt index, position), after the repetition penalty; stop strings end a row early.
#include "moe/infer/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include "io/utf8.h"
#include "moe/arena.h"
#include "moe/infer/model.h"
#include "moe/io/dataset.h"
#include "moe/rng.h"

namespace moe::infer {

namespace {

void check_inputs(const Transformer& model, const std::vector<std::vector<int32_t>>& prompts,
                  const SamplingConfig& s, int64_t batch) {
  MOE_USAGE_CHECK(batch >= 1, "generation batch ", batch, " must be at least 1");
  MOE_USAGE_CHECK(s.max_new >= 0, "max_new ", s.max_new, " is negative");
  MOE_USAGE_CHECK(std::isfinite(s.temperature) && s.temperature >= 0, "temperature ", s.temperature,
                  " must be >= 0");
  MOE_USAGE_CHECK(s.top_k >= 0, "top_k ", s.top_k, " is negative");
  MOE_USAGE_CHECK(s.top_p > 0 && s.top_p <= 1, "top_p ", s.top_p, " must be in (0, 1]");
  MOE_USAGE_CHECK(std::isfinite(s.repeat_penalty) && s.repeat_penalty > 0, "repeat_penalty ",
                  s.repeat_penalty, " must be > 0 (1 = off)");
  MOE_USAGE_CHECK(s.repeat_last_n >= -1, "repeat_last_n ", s.repeat_last_n,
                  " must be >= -1 (-1 = the whole sequence, 0 = off)");
  const int64_t seq = model.config().seq, vocab = model.config().vocab_size;
  for (const std::string& stop : s.stop) MOE_USAGE_CHECK(!stop.empty(), "a stop string is empty");
  MOE_USAGE_CHECK(s.stop.empty() || s.tokenizer || vocab <= io::kByteVocab,
                  "stop strings need a byte-level model (vocabulary <= ", io::kByteVocab,
                  ") or a tokenizer; this one has ", vocab,
                  " tokens and no decoding to match them in");
  for (size_t p = 0; p < prompts.size(); ++p) {
    const auto& prompt = prompts[p];
    const int64_t n = static_cast<int64_t>(prompt.size());
    MOE_USAGE_CHECK(n > 0, "prompt ", p, " is empty");
    MOE_USAGE_CHECK(n < seq, "prompt ", p, " has ", n, " tokens; the model's context is ", seq);
    for (int64_t i = 0; i < n; ++i)
      MOE_USAGE_CHECK(prompt[i] >= 0 && prompt[i] < vocab, "prompt ", p, ": token id ", prompt[i],
                      " at position ", i, " is outside the vocabulary (", vocab, " tokens)");
  }
}

// Incremental detokenisation of one row: the text grows by the part of the newest tokens that is
// settled, decoding a short window instead of the whole completion each step (which made a
// generation O(n^2) in its length). Both decodings start at the same token (`prefix`), so what a
// decoder does to a text's first token (SentencePiece drops its leading space) cancels in their
// difference. A window that ends in an unfinished UTF-8 sequence, or in U+FFFD (a decoder's
// stand-in for one), waits for the next token.
struct Detokenizer {
  size_t prefix = 0, read = 0;

  // The replacement character (a decoder's mark for bytes it could not finish) or a character cut
  // short: the text is not settled yet.
  static bool unfinished(const std::string& s) {
    if (s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0) return true;
    return io::utf8_ends_unfinished(s);
  }

  // The settled growth of the text after `tokens` gained one token ("" while it is unsettled).
  std::string grow(const io::Tokenizer& tok, std::span<const int32_t> tokens) {
    const std::string before = tok.decode(tokens.subspan(prefix, read - prefix));
    const std::string now = tok.decode(tokens.subspan(prefix));
    if (now.size() <= before.size() || unfinished(now)) return {};
    prefix = read;
    read = tokens.size();
    return now.substr(before.size());
  }
};

}  // namespace

uint64_t sampling_key(uint64_t seed, int64_t prompt) {
  return rng_key(seed, {hash_name("generate"), static_cast<uint64_t>(prompt)});
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingConfig& s, uint64_t key,
                     int64_t position) {
  MOE_CHECK(vocab > 0, "sample_token: empty vocabulary");
  if (s.temperature == 0) {  // greedy; the first maximum wins ties
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  // Candidates by logit, descending (ties: lower id first); the top_k of them.
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const auto before = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  size_t keep = order.size();
  if (s.top_k > 0 && s.top_k < vocab) keep = static_cast<size_t>(s.top_k);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                    before);
  // Softmax of logits / temperature over the candidates (unnormalised, max-subtracted).
  std::vector<double> weight(keep);
  double total = 0;
  const double top = logits[order[0]];
  for (size_t i = 0; i < keep; ++i) {
    weight[i] = std::exp((static_cast<double>(logits[order[i]]) - top) / s.temperature);
    total += weight[i];
  }
  if (s.top_p < 1) {  // the smallest prefix whose mass reaches top_p
    double mass = 0;
    size_t n = 0;
    while (n < keep) {
      mass += weight[n++] / total;
      if (mass >= s.top_p) break;
    }
    keep = n;
    total = 0;
    for (size_t i = 0; i < keep; ++i) total += weight[i];
  }
  const double u = static_cast<double>(rng_uniform(key, static_cast<uint64_t>(position))) * total;
  double cumulative = 0;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += weight[i];
    if (u < cumulative) return order[i];
  }
  return order[keep - 1];  // u rounded up to the total
}

void apply_repeat_penalty(float* logits, int64_t vocab, std::span<const int32_t> recent,
                          double penalty) {
  if (penalty == 1.0) return;
  const float p = static_cast<float>(penalty);
  std::vector<bool> seen(static_cast<size_t>(vocab), false);  // each token penalised once
  for (int32_t t : recent) {
    if (t < 0 || t >= vocab || seen[static_cast<size_t>(t)]) continue;
    seen[static_cast<size_t>(t)] = true;
    float& l = logits[t];
    l = l > 0 ? l / p : l * p;
  }
}

std::vector<int32_t> recent_tokens(std::span<const int32_t> prompt,
                                   std::span<const int32_t> generated, int64_t last_n) {
  const size_t total = prompt.size() + generated.size();
  const size_t n = last_n < 0 ? total : std::min(total, static_cast<size_t>(last_n));
  std::vector<int32_t> out;
  out.reserve(n);
  const size_t skip = total - n;  // of the sequence's first tokens
  if (skip < prompt.size()) out.insert(out.end(), prompt.begin() + skip, prompt.end());
  const size_t from = skip > prompt.size() ? skip - prompt.size() : 0;
  out.insert(out.end(), generated.begin() + from, generated.end());
  return out;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& s : stops_) longest_ = std::max(longest_, s.size());
}

bool StopMatcher::feed(std::string_view piece) {
  const size_t before = text_.size();
  text_.append(piece);
  // A stop string not found before ends in the new piece, so it starts at most longest - 1
  // bytes before it.
  const size_t from = before + 1 > longest_ ? before + 1 - longest_ : 0;
  size_t best = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = text_.find(s, from);
    if (at < best) {
      best = at;
      matched_ = s;
    }
  }
  if (best == std::string::npos) return false;
  cut_ = best;
  return true;
}

int64_t truncate_left(std::vector<int32_t>& prompt, int64_t context, int64_t max_new) {
  // At least one token to continue from; at most context - 1 (a prefill must leave room for one).
  const int64_t keep = std::max<int64_t>(1, std::min(context - 1, context - max_new));
  const int64_t drop = static_cast<int64_t>(prompt.size()) - keep;
  if (drop <= 0) return 0;
  prompt.erase(prompt.begin(), prompt.begin() + drop);
  return drop;
}

std::vector<Generation> generate(const Transformer& model,
                                 const std::vector<std::vector<int32_t>>& prompts,
                                 const SamplingConfig& sampling, int64_t batch,
                                 const BlockHooks* hooks) {
  check_inputs(model, prompts, sampling, batch);
  const int64_t num_prompts = static_cast<int64_t>(prompts.size());
  const int64_t seq = model.config().seq, vocab = model.config().vocab_size;
  std::vector<Generation> out(prompts.size());
  if (num_prompts == 0) return out;
  if (sampling.max_new == 0) {
    for (Generation& g : out) g.stop = "max_new";
    return out;
  }
  const bool penalise = sampling.repeat_penalty != 1.0 && sampling.repeat_last_n != 0;
  // A vocabulary padded beyond the tokenizer's (to a multiple of 64 or 128, as many released
  // models are): the ids past its end decode to nothing and are never drawn (transformers and
  // llama.cpp mask them too).
  const int64_t drawable =
      sampling.tokenizer ? std::min<int64_t>(vocab, sampling.tokenizer->vocab_size()) : vocab;
  const int64_t slots = std::min(batch, num_prompts);
  KVCache cache = model.make_cache(slots);  // allocated once, reused by every batch
  // Each forward pass's activations come from one arena, reset before the next pass: decode
  // steps reuse the same memory instead of allocating (the logits are read before the reset).
  Arena arena;
  auto forward = [&](const std::vector<int32_t>& tokens, const std::vector<int64_t>& counts,
                     const std::vector<int64_t>& rows) {
    arena.reset();
    ArenaScope scope(arena);
    return model.forward_cached(Tensor::from_vector({static_cast<int64_t>(tokens.size())}, tokens),
                                counts, rows, cache, hooks);
  };

  for (int64_t first = 0; first < num_prompts; first += slots) {
    const int64_t n = std::min(slots, num_prompts - first);
    cache.clear();
    std::vector<StopMatcher> stops(static_cast<size_t>(n), StopMatcher(sampling.stop));
    std::vector<Detokenizer> detok(static_cast<size_t>(n));
    // Prefill: the batch's prompts as one ragged batch, prompt first + s in slot s.
    std::vector<int32_t> ids;
    std::vector<int64_t> counts, active;
    for (int64_t s = 0; s < n; ++s) {
      const auto& prompt = prompts[static_cast<size_t>(first + s)];
      ids.insert(ids.end(), prompt.begin(), prompt.end());
      counts.push_back(static_cast<int64_t>(prompt.size()));
      active.push_back(s);
    }
    Tensor logits = forward(ids, counts, active);

    while (!active.empty()) {
      // Sample one token per active row (row r of logits is slot active[r]).
      const int64_t rows = static_cast<int64_t>(active.size());
      logits = logits.to(Device{});  // sampling runs on the host
      float* l = logits.data<float>();
      for (int64_t i = 0; i < rows * vocab; ++i)
        if (!std::isfinite(l[i]))
          throw NonFiniteOutput(str(
              "generation: prompt ", first + active[static_cast<size_t>(i / vocab)],
              " (from 0): the model computes non-finite logits from its weights (were they "
              "trained with a learning rate too high?); nothing is generated"));
      std::vector<int32_t> next(static_cast<size_t>(rows));
#pragma omp parallel for schedule(static) if (rows > 1 && sampling.temperature > 0)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t slot = active[static_cast<size_t>(r)];
        if (penalise)
          apply_repeat_penalty(
              l + r * vocab, vocab,
              recent_tokens(prompts[static_cast<size_t>(first + slot)],
                            out[static_cast<size_t>(first + slot)].tokens, sampling.repeat_last_n),
              sampling.repeat_penalty);
        next[static_cast<size_t>(r)] = sample_token(l + r * vocab, drawable, sampling,
                                                    sampling_key(sampling.seed, first + slot),
                                                    cache.length[static_cast<size_t>(slot)]);
      }
      // Record; rows that continue feed their token in the next step.
      std::vector<int64_t> still;
      std::vector<int32_t> feed;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t slot = active[static_cast<size_t>(r)];
        Generation& g = out[static_cast<size_t>(first + slot)];
        g.tokens.push_back(next[static_cast<size_t>(r)]);
        StopMatcher& stop = stops[static_cast<size_t>(slot)];
        const io::Tokenizer* tok = sampling.tokenizer;
        if (tok && next[static_cast<size_t>(r)] == tok->eos_id()) {
          g.tokens.pop_back();  // the end-of-text token itself is not output
          g.text = tok->decode(g.tokens);
          g.stop = "eos";
          continue;
        }
        bool stopped = false;
        if (tok) {
          const std::string grown = detok[static_cast<size_t>(slot)].grow(*tok, g.tokens);
          g.text += grown;
          if (!sampling.stop.empty()) stopped = stop.feed(grown);
          if (stopped) g.text.resize(stop.cut());
        } else if (!sampling.stop.empty()) {
          const char byte = static_cast<char>(next[static_cast<size_t>(r)]);  // byte-level
          stopped = stop.feed(std::string_view(&byte, 1));
          if (stopped) g.tokens.resize(stop.cut());  // one token per byte: it starts at a token
        }
        // Tokens of the sequence: those cached plus the one just drawn.
        if (stopped) {
          g.stop = "stop";
          g.stop_text = stop.matched();
        } else if (static_cast<int64_t>(g.tokens.size()) >= sampling.max_new) {
          g.stop = "max_new";
        } else if (cache.length[static_cast<size_t>(slot)] + 1 >= seq) {
          g.stop = "context";
        }
        if (tok && (g.stop == "max_new" || g.stop == "context"))
          g.text = tok->decode(g.tokens);  // what is still unsettled, as the decoder gives it
        if (g.stop.empty()) {
          still.push_back(slot);
          feed.push_back(next[static_cast<size_t>(r)]);
        }
      }
      active = std::move(still);
      if (active.empty()) break;
      logits = forward(feed, std::vector<int64_t>(active.size(), 1), active);
    }
  }
  return out;
}

}  // namespace moe::infer
