// Generation with a KV cache (infer::generate, Transformer::forward_cached): cached logits equal
// the full forward's at every step, greedy tokens equal a loop recomputing the full forward,
// generated tokens do not depend on the batch, seeds, stops, errors, hooks, sampling rules.
// Shapes: P prompts, T tokens, V vocabulary.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "moe/infer/generate.h"
#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "moe/offload/expert_ring.h"
#include "moe/rng.h"
#include "support/bits.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;
using infer::Generation;
using infer::SamplingConfig;
using test::bitwise_equal;
using test::ThreadGuard;

namespace {

// gpt: 3 blocks (MoE of 4 experts, dense, MoE of 3); mixtral: 2 MoE blocks, grouped-query heads.
ModelConfig generate_config(Arch arch) {
  ModelConfig c = test::small_model_config(arch);
  c.vocab_size = 64;
  if (arch == Arch::gpt) {
    c.layers = 3;
    c.experts_per_layer = {4, 0, 3};
  }
  c.resolve();
  return c;
}

// A model whose parameters are the seed's draws plus noise, so that biases and norms matter and
// the logits spread out (fewer near-ties for greedy decoding).
struct TestModel {
  explicit TestModel(Arch arch, uint64_t seed = 11)
      : config(generate_config(arch)), params(seed, config.dtype), model(config, params) {
    const uint64_t key = rng_key(seed, {0x9e4});
    uint64_t index = 0;
    for (Param* p : params.all()) {
      float* d = p->value.data<float>();
      for (int64_t i = 0; i < p->value.numel(); ++i) d[i] += 0.1f * rng_normal(key, index++);
    }
  }
  ModelConfig config;
  ParamSet params;
  Transformer model;
};

std::vector<int32_t> make_prompt(int64_t length, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < length; ++i)
    p.push_back(static_cast<int32_t>(
        rng_below(rng_key(seed, {0x9a}), static_cast<uint64_t>(i), static_cast<uint64_t>(vocab))));
  return p;
}

// Logits of the last position of `tokens` through the full forward pass.
std::vector<float> full_last_logits(const Transformer& model, const std::vector<int32_t>& tokens) {
  const int64_t t = static_cast<int64_t>(tokens.size()), v = model.config().vocab_size;
  Tensor logits = model.logits(Tensor::from_vector({1, t}, tokens));
  const float* l = logits.data<float>() + (t - 1) * v;
  return std::vector<float>(l, l + v);
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// max |a - b| / max |b|
double relative_error(const float* a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

std::vector<std::vector<int32_t>> mixed_prompts(int64_t vocab) {
  std::vector<std::vector<int32_t>> prompts;
  const int64_t lengths[] = {3, 9, 1, 14, 6, 2, 11};
  for (size_t i = 0; i < std::size(lengths); ++i)
    prompts.push_back(make_prompt(lengths[i], vocab, i));
  return prompts;
}

SamplingConfig sampled(uint64_t seed, int64_t max_new) {
  SamplingConfig s;
  s.max_new = max_new;
  s.temperature = 0.8;
  s.top_k = 5;
  s.top_p = 0.9;
  s.seed = seed;
  return s;
}

}  // namespace

TEST_CASE("generate: cached logits equal the full forward at every step", "[generate]") {
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    INFO(arch_name(arch));
    TestModel m(arch);
    const int64_t v = m.config.vocab_size, seq = m.config.seq;
    std::vector<int32_t> tokens = make_prompt(5, v, 3);
    KVCache cache = m.model.make_cache(1);
    Tensor logits = m.model.forward_cached(
        Tensor::from_vector({1, static_cast<int64_t>(tokens.size())}, tokens), cache);
    double worst = 0;
    int64_t bitwise = 0, steps = 0;
    while (true) {
      REQUIRE(logits.shape() == Shape{1, v});
      REQUIRE(cache.length[0] == static_cast<int64_t>(tokens.size()));
      std::vector<float> full = full_last_logits(m.model, tokens);
      const double err = relative_error(logits.data<float>(), full);
      worst = std::max(worst, err);
      CHECK(err <= 1e-5);
      const bool same = std::equal(full.begin(), full.end(), logits.data<float>());
      if (steps == 0) CHECK(same);  // the prefill of one row runs the full forward's products
      bitwise += same;
      ++steps;
      const int32_t next = argmax(full);
      CHECK(static_cast<int32_t>(std::max_element(logits.data<float>(), logits.data<float>() + v) -
                                 logits.data<float>()) == next);
      if (static_cast<int64_t>(tokens.size()) == seq) break;  // the cache is full
      tokens.push_back(next);
      logits =
          m.model.forward_cached(Tensor::from_vector({1, 1}, std::vector<int32_t>{next}), cache);
    }
    CHECK(steps == seq - 4);
    CHECK(cache.length[0] == seq);
    INFO("worst relative logit error over " << steps << " steps: " << worst << "; bitwise equal at "
                                            << bitwise << " steps");
    CHECK(worst <= 1e-5);
    // A position past the context is refused.
    CHECK_THROWS_AS(
        m.model.forward_cached(Tensor::from_vector({1, 1}, std::vector<int32_t>{0}), cache), Error);
  }
}

TEST_CASE("generate: greedy tokens equal a loop over the full forward", "[generate]") {
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    INFO(arch_name(arch));
    TestModel m(arch);
    const auto prompts = mixed_prompts(m.config.vocab_size);
    SamplingConfig greedy;
    greedy.max_new = 12;
    const std::vector<Generation> out = infer::generate(m.model, prompts, greedy, 3);
    REQUIRE(out.size() == prompts.size());
    for (size_t p = 0; p < prompts.size(); ++p) {
      INFO("prompt " << p);
      std::vector<int32_t> seq = prompts[p], expected;
      while (static_cast<int64_t>(expected.size()) < greedy.max_new &&
             static_cast<int64_t>(seq.size()) < m.config.seq) {
        const int32_t next = argmax(full_last_logits(m.model, seq));
        expected.push_back(next);
        seq.push_back(next);
      }
      CHECK(out[p].tokens == expected);
      CHECK(out[p].stop == "max_new");
    }
  }
}

// Whether a row of a GEMM rounds the same whatever rows share the call is a property of the BLAS
// kernel, not of ours: OpenBLAS's Haswell sgemm kernel rounds a row differently by its position in
// a block of rows (its SkylakeX kernel does not). So what holds everywhere is checked: the same
// batch gives the same bits at any thread count (tiles fixed by shape, cpu::sgemm), and a row in
// a batch equals the row alone up to f32 rounding. Tolerance: every logit is a chain of f32 dot
// products of length <= 4 D = 128 through 2-3 blocks; a different summation order changes each
// by a few ulps of its terms' magnitude, i.e. ~1e-6 of the logits' scale; we allow 2e-5 of the
// largest |logit| (measured differences are below 1e-6 of it), far below the 0.1-1 gaps between
// logits that a real bug (a row reading its neighbour's cache or keys) produces.
TEST_CASE("generate: a row's logits do not depend on the rows beside it (f32 rounding aside)",
          "[generate]") {
  ThreadGuard guard;
  // Ragged prefill of three prompts, then decode steps, against each prompt alone.
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    INFO(arch_name(arch));
    TestModel m(arch);
    const int64_t v = m.config.vocab_size;
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(4, v, 1), make_prompt(9, v, 2),
                                                       make_prompt(1, v, 3)};
    // Logits [3, V] per step of the joint batch (rows in prompt order).
    auto joint_run = [&](int threads) {
      set_num_threads(threads);
      std::vector<Tensor> steps;
      KVCache together = m.model.make_cache(3);
      std::vector<int32_t> ids;
      for (const auto& p : prompts) ids.insert(ids.end(), p.begin(), p.end());
      steps.push_back(
          m.model.forward_cached(Tensor::from_vector({14}, ids), {4, 9, 1}, {0, 1, 2}, together));
      for (int step = 0; step < 3; ++step) {
        // Decode rows in another order than their slots: slot 2, 0, 1.
        Tensor logits = m.model.forward_cached(
            Tensor::from_vector({3}, std::vector<int32_t>{step + 2, step, step + 1}), {1, 1, 1},
            {2, 0, 1}, together);
        Tensor ordered = Tensor::empty({3, v});
        const float* s = logits.data<float>();
        std::copy(s + v, s + 2 * v, ordered.data<float>());
        std::copy(s + 2 * v, s + 3 * v, ordered.data<float>() + v);
        std::copy(s, s + v, ordered.data<float>() + 2 * v);
        steps.push_back(ordered);
      }
      return steps;
    };
    const std::vector<Tensor> one = joint_run(1), two = joint_run(2);
    for (size_t step = 0; step < one.size(); ++step) {
      INFO("step " << step);
      CHECK(bitwise_equal(one[step], two[step]));
    }
    for (size_t r = 0; r < prompts.size(); ++r) {
      INFO("prompt " << r);
      KVCache alone = m.model.make_cache(1);
      const std::vector<int32_t>& seq = prompts[r];
      std::vector<Tensor> singles = {m.model.forward_cached(
          Tensor::from_vector({1, static_cast<int64_t>(seq.size())}, seq), alone)};
      for (int step = 0; step < 3; ++step)
        singles.push_back(m.model.forward_cached(
            Tensor::from_vector({1, 1}, std::vector<int32_t>{static_cast<int32_t>(step + r)}),
            alone));
      for (size_t step = 0; step < singles.size(); ++step) {
        INFO("step " << step);
        const float* a = one[step].data<float>() + r * static_cast<size_t>(v);
        const float* b = singles[step].data<float>();
        float scale = 0, diff = 0;
        for (int64_t j = 0; j < v; ++j) {
          scale = std::max(scale, std::fabs(b[j]));
          diff = std::max(diff, std::fabs(a[j] - b[j]));
        }
        REQUIRE(scale > 0.1f);  // the logits spread out: the check below has teeth
        CHECK(diff <= 2e-5f * scale);
      }
    }
  }
}

// Tokens, not logits: a row's logits in a batch equal the row's alone only to f32 rounding (the
// test above; the BLAS kernel decides), ~1e-6 of their scale, while the test model's logits are
// spread out by its noise; a flip needs a near-tie (greedy) or a uniform draw within ~1e-6 of a
// CDF boundary (sampled), which these fixed prompts and seeds do not hit on any kernel we run.
TEST_CASE("generate: outputs do not depend on the batch", "[generate]") {
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    INFO(arch_name(arch));
    TestModel m(arch);
    const auto prompts = mixed_prompts(m.config.vocab_size);
    SamplingConfig greedy;
    greedy.max_new = 10;
    for (const SamplingConfig& s : {greedy, sampled(5, 10)}) {
      INFO("temperature " << s.temperature);
      const auto one = infer::generate(m.model, prompts, s, 1);
      for (int64_t batch : {3, 7, 16}) {
        INFO("batch " << batch);
        const auto many = infer::generate(m.model, prompts, s, batch);
        for (size_t p = 0; p < prompts.size(); ++p) {
          CHECK(many[p].tokens == one[p].tokens);
          CHECK(many[p].stop == one[p].stop);
        }
      }
      // A prompt alone gives what it gives among the others (at the same index: sampling is
      // keyed by the prompt's index).
      std::vector<std::vector<int32_t>> only = {{0}, {0}, {0}, prompts[3]};
      const auto alone = infer::generate(m.model, only, s, 4);
      CHECK(alone[3].tokens == one[3].tokens);
    }
  }
}

TEST_CASE("generate: seeds", "[generate]") {
  TestModel m(Arch::mixtral);
  const auto prompts = mixed_prompts(m.config.vocab_size);
  const auto a = infer::generate(m.model, prompts, sampled(1, 12), 4);
  const auto b = infer::generate(m.model, prompts, sampled(1, 12), 4);
  const auto c = infer::generate(m.model, prompts, sampled(2, 12), 4);
  size_t differ = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    CHECK(a[p].tokens == b[p].tokens);
    differ += a[p].tokens != c[p].tokens;
  }
  CHECK(differ > 0);
  // Greedy ignores the seed.
  SamplingConfig g1, g2;
  g1.max_new = g2.max_new = 6;
  g2.seed = 99;
  const auto x = infer::generate(m.model, prompts, g1, 2);
  const auto y = infer::generate(m.model, prompts, g2, 2);
  for (size_t p = 0; p < prompts.size(); ++p) CHECK(x[p].tokens == y[p].tokens);
}

TEST_CASE("generate: stops at max_new and at the context", "[generate]") {
  TestModel m(Arch::gpt);
  const int64_t v = m.config.vocab_size, seq = m.config.seq;
  const std::vector<std::vector<int32_t>> prompts = {
      make_prompt(seq - 3, v, 1), make_prompt(2, v, 2), make_prompt(seq - 1, v, 3)};
  for (const SamplingConfig& s : {SamplingConfig{}, sampled(3, 64)}) {
    SamplingConfig c = s;
    c.max_new = 10;
    const auto out = infer::generate(m.model, prompts, c, 2);
    CHECK(out[0].tokens.size() == 3);
    CHECK(out[0].stop == "context");
    CHECK(out[1].tokens.size() == 10);
    CHECK(out[1].stop == "max_new");
    CHECK(out[2].tokens.size() == 1);
    CHECK(out[2].stop == "context");
    for (const Generation& g : out)
      for (int32_t t : g.tokens) CHECK((t >= 0 && t < v));
  }
  SamplingConfig exact;  // reaching both at once reports max_new
  exact.max_new = 3;
  CHECK(infer::generate(m.model, {prompts[0]}, exact, 1)[0].stop == "max_new");
  SamplingConfig none;
  none.max_new = 0;
  const auto empty = infer::generate(m.model, prompts, none, 2);
  CHECK(empty[1].tokens.empty());
  CHECK(empty[1].stop == "max_new");
  CHECK(infer::generate(m.model, {}, exact, 2).empty());
}

TEST_CASE("generate: errors", "[generate]") {
  TestModel m(Arch::mixtral);
  const int64_t v = m.config.vocab_size, seq = m.config.seq;
  const std::vector<int32_t> ok = make_prompt(4, v, 1);
  SamplingConfig s;
  s.max_new = 2;
  using Catch::Matchers::Contains;
  CHECK_THROWS_MATCHES(infer::generate(m.model, {ok, {}}, s, 2), UsageError,
                       Catch::Matchers::Predicate<UsageError>([](const UsageError& e) {
                         return std::string(e.what()).find("prompt 1 is empty") !=
                                std::string::npos;
                       }));
  try {
    infer::generate(m.model, {ok, ok, make_prompt(seq, v, 2)}, s, 2);
    FAIL("no error for a prompt as long as the context");
  } catch (const UsageError& e) {
    CHECK_THAT(e.what(), Contains("prompt 2 has 32 tokens; the model's context is 32"));
  }
  CHECK_THROWS_AS(infer::generate(m.model, {make_prompt(seq + 5, v, 2)}, s, 1), UsageError);
  for (int32_t bad : {-1, static_cast<int32_t>(v)}) {
    std::vector<int32_t> p = ok;
    p[2] = bad;
    try {
      infer::generate(m.model, {p}, s, 1);
      FAIL("no error for token id " << bad);
    } catch (const UsageError& e) {
      CHECK_THAT(e.what(), Contains("token id " + std::to_string(bad)));
      CHECK_THAT(e.what(), Contains("vocabulary"));
    }
  }
  CHECK_THROWS_AS(infer::generate(m.model, {ok}, s, 0), UsageError);
  SamplingConfig bad = s;
  bad.temperature = -1;
  CHECK_THROWS_AS(infer::generate(m.model, {ok}, bad, 1), UsageError);
  bad = s;
  bad.top_p = 0;
  CHECK_THROWS_AS(infer::generate(m.model, {ok}, bad, 1), UsageError);
  bad = s;
  bad.top_k = -2;
  CHECK_THROWS_AS(infer::generate(m.model, {ok}, bad, 1), UsageError);
}

TEST_CASE("generate: hooks run around every block of every step", "[generate]") {
  TestModel m(Arch::gpt);
  const int64_t v = m.config.vocab_size, layers = m.config.layers;
  const std::vector<std::vector<int32_t>> prompts = {make_prompt(3, v, 1), make_prompt(7, v, 2)};
  std::vector<std::string> events;
  BlockHooks hooks;
  hooks.before = [&](int64_t b) { events.push_back("before " + std::to_string(b)); };
  hooks.after = [&](int64_t b) { events.push_back("after " + std::to_string(b)); };
  SamplingConfig s;
  s.max_new = 3;
  std::vector<std::string> pass;  // one forward step
  for (int64_t b = 0; b < layers; ++b) {
    pass.push_back("before " + std::to_string(b));
    pass.push_back("after " + std::to_string(b));
  }
  // Batch 2: one prefill and two decode steps (the third token needs no forward); batch 1: that
  // for each prompt.
  for (int64_t batch : {2, 1}) {
    events.clear();
    const auto with = infer::generate(m.model, prompts, s, batch, &hooks);
    const int64_t passes = batch == 2 ? 3 : 6;
    std::vector<std::string> expected;
    for (int64_t i = 0; i < passes; ++i) expected.insert(expected.end(), pass.begin(), pass.end());
    CHECK(events == expected);
    const auto without = infer::generate(m.model, prompts, s, batch);
    for (size_t p = 0; p < prompts.size(); ++p) CHECK(with[p].tokens == without[p].tokens);
  }
}

TEST_CASE("generate: sampling rules", "[generate]") {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f};
  const int64_t v = static_cast<int64_t>(logits.size());
  const uint64_t key = infer::sampling_key(7, 0);
  SamplingConfig s;
  CHECK(infer::sample_token(logits.data(), v, s, key, 0) == 1);  // greedy: lowest id of the tie
  s.temperature = 1.0;
  s.top_k = 1;  // top-1 is greedy
  for (int64_t pos = 0; pos < 50; ++pos)
    CHECK(infer::sample_token(logits.data(), v, s, key, pos) == 1);
  s.top_k = 0;
  s.top_p = 1e-6;  // the smallest prefix is the top token
  for (int64_t pos = 0; pos < 50; ++pos)
    CHECK(infer::sample_token(logits.data(), v, s, key, pos) == 1);

  // top-k 3: ids 1, 3, 2 with probabilities e^3 : e^3 : e^2 (temperature 1).
  s.top_p = 1.0;
  s.top_k = 3;
  std::map<int32_t, int> counts;
  const int draws = 20000;
  for (int64_t pos = 0; pos < draws; ++pos)
    ++counts[infer::sample_token(logits.data(), v, s, key, pos)];
  CHECK(counts.size() == 3);
  const double z = 2 * std::exp(3.0) + std::exp(2.0);
  CHECK(counts[1] / double(draws) == Approx(std::exp(3.0) / z).margin(0.015));
  CHECK(counts[3] / double(draws) == Approx(std::exp(3.0) / z).margin(0.015));
  CHECK(counts[2] / double(draws) == Approx(std::exp(2.0) / z).margin(0.015));

  // top-p 0.7 over that top-3: ids 1 and 3 hold 2e^3/z = 0.84 >= 0.7, id 1 alone 0.42: keep two.
  s.top_p = 0.7;
  counts.clear();
  for (int64_t pos = 0; pos < draws; ++pos)
    ++counts[infer::sample_token(logits.data(), v, s, key, pos)];
  CHECK(counts.size() == 2);
  CHECK(counts[1] / double(draws) == Approx(0.5).margin(0.015));

  // A low temperature sharpens towards the top tokens; the draw is a function of (key, position).
  s.top_p = 1.0;
  s.top_k = 0;
  s.temperature = 0.05;
  for (int64_t pos = 0; pos < 50; ++pos) {
    const int32_t t = infer::sample_token(logits.data(), v, s, key, pos);
    CHECK((t == 1 || t == 3));
    CHECK(infer::sample_token(logits.data(), v, s, key, pos) == t);
  }
}

TEST_CASE("generate: through an expert ring equals the resident model", "[generate]") {
  // One slot for two MoE layers: every step of every pass loads experts through the ring.
  TestModel m(Arch::mixtral);
  test::ScratchDir dir("generate_ring");
  const std::string path = dir / "model.h5";
  io::Checkpoint ckpt;
  ckpt.model_config = to_json(m.config);
  for (Param* p : m.params.all()) ckpt.params.push_back({p->name, p->value, p->expert, p->shard});
  io::save_checkpoint(path, ckpt);

  const auto prompts = mixed_prompts(m.config.vocab_size);
  for (const SamplingConfig& s : {SamplingConfig{6, 0, 0, 1.0, 0}, sampled(4, 6)}) {
    const auto resident = infer::generate(m.model, prompts, s, 3);
    infer::LoadedModel offloaded = infer::load_ring_model(path);
    offload::RingConfig rc;
    rc.budget_bytes = offloaded.ring->layer_bytes();  // one layer's experts (fp32): one slot
    offloaded.ring->start(rc);
    REQUIRE(offloaded.ring->slots() == 1);
    const auto streamed = infer::generate(*offloaded.model, prompts, s, 3);
    for (size_t p = 0; p < prompts.size(); ++p) CHECK(streamed[p].tokens == resident[p].tokens);
    CHECK(offloaded.ring->stats().layers_loaded > 0);
  }
}
