// What steers and ends a generation besides sampling (moe-infer generate's --repeat-penalty,
// --stop, --truncate): llama.cpp's repetition penalty on hand-computed logits and inside
// generate(), stop strings found across token boundaries and cut from the output, left truncation,
// the prompt file's keys for them, and that the defaults leave greedy decoding as it was.
// Shapes: V vocabulary, S the model's context.
#include <catch2/catch.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "moe/infer/generate.h"
#include "moe/infer/prompts.h"
#include "moe/io/tokenizer.h"
#include "moe/rng.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;
using infer::Generation;
using infer::SamplingConfig;

namespace {

// gpt, 2 MoE blocks, V = 64 (byte tokens 0..63, so stop strings can be matched), S = 32; the
// seed's weights plus noise, so that the logits spread out and greedy decoding has no near-ties.
struct NoisyModel {
  NoisyModel() : config(make_config()), params(5, config.dtype), model(config, params) {
    const uint64_t key = rng_key(5, {0x57a});
    uint64_t index = 0;
    for (Param* p : params.all()) {
      float* d = p->value.data<float>();
      for (int64_t i = 0; i < p->value.numel(); ++i) d[i] += 0.1f * rng_normal(key, index++);
    }
  }
  static ModelConfig make_config() {
    ModelConfig c = test::small_model_config(Arch::gpt);
    c.vocab_size = 64;
    c.resolve();
    return c;
  }
  ModelConfig config;
  ParamSet params;
  Transformer model;
};

NoisyModel& noisy_model() {
  static NoisyModel m;
  return m;
}

std::vector<std::vector<int32_t>> prompts_of(int64_t vocab) {
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t length : {4, 9, 1, 6}) {
    std::vector<int32_t> p;
    for (int64_t i = 0; i < length; ++i)
      p.push_back(static_cast<int32_t>(rng_below(rng_key(length, {0xc0}), static_cast<uint64_t>(i),
                                                 static_cast<uint64_t>(vocab))));
    prompts.push_back(p);
  }
  return prompts;
}

// The reference: greedy decoding by the full forward pass, the penalty applied by hand to the
// last position's logits (tokens of the last `last_n` of the sequence), max_new tokens or the
// context.
std::vector<int32_t> reference_greedy(const Transformer& model, std::vector<int32_t> seq,
                                      int64_t max_new, double penalty, int64_t last_n) {
  const int64_t v = model.config().vocab_size;
  std::vector<int32_t> out;
  while (static_cast<int64_t>(out.size()) < max_new &&
         static_cast<int64_t>(seq.size()) < model.config().seq) {
    const int64_t t = static_cast<int64_t>(seq.size());
    Tensor logits = model.logits(Tensor::from_vector({1, t}, seq));
    std::vector<float> last(logits.data<float>() + (t - 1) * v, logits.data<float>() + t * v);
    if (penalty != 1.0) {
      std::vector<bool> seen(static_cast<size_t>(v));
      for (int64_t i = std::max<int64_t>(0, t - last_n); i < t; ++i) {
        const int32_t id = seq[static_cast<size_t>(i)];
        if (seen[static_cast<size_t>(id)]) continue;
        seen[static_cast<size_t>(id)] = true;
        float& l = last[static_cast<size_t>(id)];
        l = l > 0 ? l / static_cast<float>(penalty) : l * static_cast<float>(penalty);
      }
    }
    const int32_t next =
        static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    out.push_back(next);
    seq.push_back(next);
  }
  return out;
}

std::string bytes_of(const std::vector<int32_t>& tokens) {
  std::string s;
  for (int32_t t : tokens) s += static_cast<char>(t);
  return s;
}

}  // namespace

TEST_CASE("generate controls: the repetition penalty on hand-computed logits", "[generate]") {
  // Token 0 (positive) is divided, 1 (negative) multiplied, 4 (zero) stays zero; 1 occurs twice
  // and is penalised once; 9 and -1 are outside the vocabulary and ignored; 2, 3, 5 unseen.
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f, -4.0f};
  const std::vector<int32_t> recent = {0, 1, 1, 4, 9, -1};
  infer::apply_repeat_penalty(logits.data(), 6, recent, 2.0);
  CHECK(logits == std::vector<float>{1.0f, -2.0f, 0.5f, 3.0f, 0.0f, -4.0f});
  // A penalty below 1 rewards repeats instead (llama.cpp allows it): 0.5 doubles token 3.
  infer::apply_repeat_penalty(logits.data(), 6, std::vector<int32_t>{3}, 0.5);
  CHECK(logits[3] == 6.0f);
  // 1 touches nothing, bit for bit (a NaN-free row compared element by element).
  const std::vector<float> before = logits;
  infer::apply_repeat_penalty(logits.data(), 6, std::vector<int32_t>{0, 1, 2, 3, 4, 5}, 1.0);
  CHECK(logits == before);
  // The window: the last N of prompt + generated; -1 all of it.
  const std::vector<int32_t> prompt = {1, 2, 3}, generated = {4, 5};
  CHECK(infer::recent_tokens(prompt, generated, 3) == std::vector<int32_t>{3, 4, 5});
  CHECK(infer::recent_tokens(prompt, generated, 1) == std::vector<int32_t>{5});
  CHECK(infer::recent_tokens(prompt, generated, 2) == std::vector<int32_t>{4, 5});
  CHECK(infer::recent_tokens(prompt, generated, 10) == std::vector<int32_t>{1, 2, 3, 4, 5});
  CHECK(infer::recent_tokens(prompt, generated, -1) == std::vector<int32_t>{1, 2, 3, 4, 5});
  CHECK(infer::recent_tokens(prompt, {}, 2) == std::vector<int32_t>{2, 3});
  CHECK(infer::recent_tokens(prompt, generated, 0).empty());
}

TEST_CASE("generate controls: stop strings are found across token boundaries", "[generate]") {
  infer::StopMatcher m({"o W", "xyz"});
  CHECK_FALSE(m.feed("Hel"));
  CHECK_FALSE(m.feed("lo"));
  CHECK(m.feed(" Wor"));  // "o W" spans three pieces
  CHECK(m.cut() == 4);
  CHECK(m.matched() == "o W");
  // One byte at a time (the byte-level tokens generate() feeds); the earliest match wins when two
  // end in the same piece, whichever is listed first.
  infer::StopMatcher bytes({"cd", "bcd", "zz"});
  const std::string text = "abcde";
  size_t stopped_at = 0;
  for (size_t i = 0; i < text.size(); ++i)
    if (bytes.feed(text.substr(i, 1))) {
      stopped_at = i;
      break;
    }
  CHECK(stopped_at == 3);
  CHECK(bytes.cut() == 1);
  CHECK(bytes.matched() == "bcd");
  // A text that only comes close never matches.
  infer::StopMatcher none({"abc"});
  for (char c : std::string("ababab_ab_c")) CHECK_FALSE(none.feed(std::string(1, c)));
}

TEST_CASE("generate controls: left truncation keeps the last context - max_new tokens",
          "[generate]") {
  std::vector<int32_t> prompt(40);
  for (int32_t i = 0; i < 40; ++i) prompt[static_cast<size_t>(i)] = i;
  std::vector<int32_t> p = prompt;
  CHECK(infer::truncate_left(p, 16, 6) == 30);
  CHECK(p == std::vector<int32_t>(prompt.begin() + 30, prompt.end()));  // tokens 30..39
  p = prompt;
  CHECK(infer::truncate_left(p, 16, 20) == 39);  // no room at all: the last token stays
  CHECK(p == std::vector<int32_t>{39});
  p = prompt;
  CHECK(infer::truncate_left(p, 16, 0) == 25);  // nothing to generate: still a prompt that fits
  CHECK(p.size() == 15);
  p = {1, 2, 3};
  CHECK(infer::truncate_left(p, 16, 6) == 0);  // fits: unchanged
  CHECK(p == std::vector<int32_t>{1, 2, 3});
  p = std::vector<int32_t>(prompt.begin(), prompt.begin() + 10);
  CHECK(infer::truncate_left(p, 16, 6) == 0);  // exactly context - max_new
}

TEST_CASE("generate controls: the defaults are today's greedy decoding, bit for bit",
          "[generate]") {
  NoisyModel& m = noisy_model();
  const auto prompts = prompts_of(m.config.vocab_size);
  SamplingConfig defaults;
  defaults.max_new = 10;
  REQUIRE(defaults.repeat_penalty == 1.0);
  REQUIRE(defaults.stop.empty());
  const auto out = infer::generate(m.model, prompts, defaults, 3);
  for (size_t p = 0; p < prompts.size(); ++p) {
    INFO("prompt " << p);
    CHECK(out[p].tokens == reference_greedy(m.model, prompts[p], 10, 1.0, 0));
    CHECK(out[p].stop == "max_new");
    CHECK(std::string(out[p].finish_reason()) == "length");
  }
}

TEST_CASE("generate controls: the penalty inside generate() is the hand-applied one",
          "[generate]") {
  NoisyModel& m = noisy_model();
  const auto prompts = prompts_of(m.config.vocab_size);
  SamplingConfig plain;
  plain.max_new = 12;
  const auto base = infer::generate(m.model, prompts, plain, 2);
  size_t changed = 0;
  for (int64_t last_n : {int64_t{4}, int64_t{-1}}) {
    SamplingConfig s = plain;
    s.repeat_penalty = 3.0;
    s.repeat_last_n = last_n;
    const auto out = infer::generate(m.model, prompts, s, 2);
    for (size_t p = 0; p < prompts.size(); ++p) {
      INFO("prompt " << p << ", last " << last_n);
      CHECK(out[p].tokens ==
            reference_greedy(m.model, prompts[p], 12, 3.0, last_n < 0 ? 1000 : last_n));
      changed += out[p].tokens != base[p].tokens;
    }
  }
  CHECK(changed > 0);  // the penalty has teeth on this model
  SamplingConfig off = plain;
  off.repeat_penalty = 3.0;
  off.repeat_last_n = 0;  // a window of nothing
  const auto same = infer::generate(m.model, prompts, off, 2);
  for (size_t p = 0; p < prompts.size(); ++p) CHECK(same[p].tokens == base[p].tokens);
}

TEST_CASE("generate controls: a stop string ends the row and is left out", "[generate]") {
  NoisyModel& m = noisy_model();
  const auto prompts = prompts_of(m.config.vocab_size);
  SamplingConfig plain;
  plain.max_new = 12;
  const auto base = infer::generate(m.model, prompts, plain, 4);
  // Each prompt's own stop: the 2 tokens at positions 3 and 4 of its unstopped output, so the
  // match spans a token boundary; expected output: the bytes before its first occurrence.
  for (int64_t batch : {1, 4}) {
    for (size_t p = 0; p < prompts.size(); ++p) {
      INFO("prompt " << p << ", batch " << batch);
      const std::string text = bytes_of(base[p].tokens);
      const std::string stop = text.substr(3, 2);
      SamplingConfig s = plain;
      s.stop = {"never-there", stop};
      const auto out = infer::generate(m.model, {prompts[p]}, s, batch);
      const size_t at = text.find(stop);
      CHECK(out[0].tokens == std::vector<int32_t>(base[p].tokens.begin(),
                                                  base[p].tokens.begin() + static_cast<long>(at)));
      CHECK(out[0].stop == "stop");
      CHECK(out[0].stop_text == stop);
      CHECK(std::string(out[0].finish_reason()) == "stop");
    }
  }
  // All prompts in one batch with a stop none of them makes: nothing changes.
  SamplingConfig never = plain;
  never.stop = {std::string(1, static_cast<char>(200))};  // a byte outside the vocabulary
  const auto out = infer::generate(m.model, prompts, never, 4);
  for (size_t p = 0; p < prompts.size(); ++p) {
    CHECK(out[p].tokens == base[p].tokens);
    CHECK(out[p].stop == "max_new");
  }
}

TEST_CASE("generate controls: bad settings are refused", "[generate]") {
  NoisyModel& m = noisy_model();
  const std::vector<std::vector<int32_t>> one = {{1, 2, 3}};
  auto error = [&](const SamplingConfig& s) {
    return test::error_of([&] { infer::generate(m.model, one, s, 1); });
  };
  SamplingConfig s;
  s.repeat_penalty = 0;
  CHECK_THAT(error(s), Catch::Contains("repeat_penalty 0 must be > 0"));
  s.repeat_penalty = -1;
  CHECK_THAT(error(s), Catch::Contains("repeat_penalty"));
  s = SamplingConfig{};
  s.repeat_last_n = -2;
  CHECK_THAT(error(s), Catch::Contains("repeat_last_n -2 must be >= -1"));
  s = SamplingConfig{};
  s.stop = {"ok", ""};
  CHECK_THAT(error(s), Catch::Contains("a stop string is empty"));
  CHECK_THROWS_AS(infer::generate(m.model, one, s, 1), UsageError);
  // A model whose tokens are not bytes has no text to find a stop string in.
  ModelConfig big = test::small_model_config(Arch::gpt);
  big.vocab_size = 300;
  big.resolve();
  ParamSet params(1, big.dtype);
  Transformer model(big, params);
  SamplingConfig stop;
  stop.stop = {"x"};
  CHECK_THAT(test::error_of([&] { infer::generate(model, one, stop, 1); }),
             Catch::Contains("stop strings need a byte-level model"));
}

TEST_CASE("generate controls: prompt files carry stop strings and the penalty", "[infer]") {
  infer::SamplingConfig defaults;
  defaults.stop = {"\n"};
  auto read = [&](const std::string& text) {
    std::istringstream in(text);
    return infer::read_prompts(in, "p.jsonl", defaults, 256);
  };
  auto prompts = read(
      "plain\n{\"prompt\": \"a\", \"stop\": [\"END\", \"--\"], \"repeat_penalty\": 1.3, "
      "\"repeat_last_n\": -1}\n{\"prompt\": \"b\", \"stop\": \"x\"}\n{\"prompt\": \"c\", "
      "\"stop\": []}\n");
  REQUIRE(prompts.size() == 4);
  CHECK(prompts[0].sampling.stop == std::vector<std::string>{"\n"});  // the defaults
  CHECK(prompts[0].line == 1);
  CHECK(prompts[1].sampling.stop == std::vector<std::string>{"END", "--"});  // replaced
  CHECK(prompts[1].sampling.repeat_penalty == 1.3);
  CHECK(prompts[1].sampling.repeat_last_n == -1);
  CHECK(prompts[2].sampling.stop == std::vector<std::string>{"x"});
  CHECK(prompts[3].sampling.stop.empty());  // none for this one
  CHECK(prompts[3].line == 4);
  auto error = [&](const std::string& text) { return test::error_of([&] { read(text); }); };
  CHECK_THAT(
      error("{\"prompt\": \"a\", \"stop\": 3}\n"),
      Catch::Contains("p.jsonl:1") && Catch::Contains("\"stop\" must be a string or a list"));
  CHECK_THAT(error("{\"prompt\": \"a\", \"stop\": [\"a\", 1]}\n"),
             Catch::Contains("\"stop\" must be a string or a list"));
  CHECK_THAT(error("{\"prompt\": \"a\", \"stop\": [\"\"]}\n"), Catch::Contains("empty string"));
  CHECK_THAT(error("{\"prompt\": \"a\", \"repeat_penalty\": 0}\n"),
             Catch::Contains("out of range (0, 1e+06]"));
  CHECK_THAT(error("{\"prompt\": \"a\", \"repeat_last_n\": -2}\n"),
             Catch::Contains("out of range"));
  CHECK_THAT(error("{\"prompt\": \"a\", \"stops\": [\"a\"]}\n"),
             Catch::Contains("unknown key \"stops\""));
}

// With a tokenizer, the completion's text grows by decoding a short window of the newest tokens,
// not the whole completion each step; the text it builds must still be the decoder's text of the
// tokens. A stop string taken from the middle of each free-running completion ends that row
// with exactly the decoding of its tokens up to the stop string (sampling is keyed by prompt and
// position, and the batches are the same, so the run with stops draws the same tokens until it
// stops). The SentencePiece model
// has byte-fallback tokens, so multi-byte characters arrive over several tokens; its decoder
// drops the first piece's leading space, which a window starting mid-text must not repeat.
TEST_CASE("generate: text decoded incrementally equals the tokenizer's decoding, stops included",
          "[generate][tokenizer]") {
  for (const char* name : {"spm", "bpe-qwen"}) {
    INFO(name);
    const auto tok = io::load_tokenizer(std::string(MOE_TEST_DATA_DIR) + "/tokenizers/" + name);
    ModelConfig c = test::small_model_config(Arch::mixtral);
    c.vocab_size = tok->vocab_size();
    c.seq = 64;
    c.resolve();
    ParamSet params(11, c.dtype);
    Transformer model(c, params);
    SamplingConfig s;
    s.temperature = 1.5;  // spread the draws over the vocabulary (byte tokens included)
    s.max_new = 40;
    s.tokenizer = tok.get();
    const auto prompts = prompts_of(c.vocab_size);
    const std::vector<Generation> free = infer::generate(model, prompts, s, 2);
    int stopped = 0;
    for (size_t p = 0; p < prompts.size(); ++p) {
      const Generation& g = free[p];
      REQUIRE(g.text == tok->decode(g.tokens));
      if (g.stop != "max_new" || g.text.size() < 12) continue;
      // A stop string from the middle of the text, starting at its first occurrence.
      size_t at = g.text.size() / 2;
      while (at < g.text.size() && (static_cast<unsigned char>(g.text[at]) & 0xc0) == 0x80) ++at;
      const std::string stop = g.text.substr(at, 3);
      const size_t first = g.text.find(stop);
      SamplingConfig with_stop = s;
      with_stop.stop = {stop};
      const Generation cut = infer::generate(model, prompts, with_stop, 2).at(p);
      CHECK(cut.stop == "stop");
      CHECK(cut.text == g.text.substr(0, first));
      ++stopped;
    }
    REQUIRE(stopped >= 2);
  }
}

// Issue 44, defect 4: a model whose vocabulary is padded beyond its tokenizer (as many released
// models are, to a multiple of 64 or 128) drew ids the tokenizer cannot decode, and the decoding
// error ended the whole batch. Those ids are now never drawn (transformers and llama.cpp mask
// them too). At temperature 4 the 64 padded ids of ~660 hold about a tenth of the mass, so 4
// prompts x 40 tokens draw one with near certainty unless they are masked; greedy decoding is
// masked the same way.
TEST_CASE("generate: ids past the tokenizer's end are never drawn", "[generate][tokenizer]") {
  const auto tok = io::load_tokenizer(std::string(MOE_TEST_DATA_DIR) + "/tokenizers/bpe-qwen");
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.vocab_size = tok->vocab_size() + 64;
  c.seq = 64;
  c.resolve();
  ParamSet params(13, c.dtype);
  Transformer model(c, params);
  const auto prompts = prompts_of(tok->vocab_size());
  for (double temperature : {4.0, 0.0}) {
    INFO("temperature " << temperature);
    SamplingConfig s;
    s.temperature = temperature;
    s.max_new = 40;
    s.tokenizer = tok.get();
    const std::vector<Generation> out = infer::generate(model, prompts, s, 2);
    REQUIRE(out.size() == prompts.size());
    for (const Generation& g : out) {
      REQUIRE_FALSE(g.tokens.empty());
      for (int32_t id : g.tokens) REQUIRE(id < tok->vocab_size());
      REQUIRE(g.text == tok->decode(g.tokens));
    }
  }
}

// The same for prompts given as ids: one past the tokenizer's end (but inside the padded model
// vocabulary) was generated from, and then decoding the prompt for the output failed and lost
// every prompt's result. It is refused when the prompts are read, naming the line.
TEST_CASE("generate: prompt ids past the tokenizer's end are refused up front",
          "[generate][tokenizer]") {
  const auto tok = io::load_tokenizer(std::string(MOE_TEST_DATA_DIR) + "/tokenizers/bpe-qwen");
  const int64_t padded = tok->vocab_size() + 64;
  std::istringstream in("{\"tokens\": [1, 2]}\n{\"tokens\": [1, 720]}\n");
  REQUIRE_THAT(test::error_of([&] {
                 infer::read_prompts(in, "p.jsonl", SamplingConfig{}, padded, tok.get());
               }),
               Catch::Contains("p.jsonl:2: \"tokens\" 720 is out of range [0, 699]"));
  std::istringstream ok("{\"tokens\": [1, 699]}\n");
  REQUIRE(infer::read_prompts(ok, "p.jsonl", SamplingConfig{}, padded, tok.get()).size() == 1);
}
