// Per-token log-probabilities (issue 44): infer::token_logprob against a log-softmax written out,
// EvalOptions::logit_rows seeing every row of logits once and in order, and infer::score's
// per-token output against a double log-softmax of Transformer::logits.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>

#include "moe/comm/communicator.h"
#include "moe/infer/engine.h"
#include "moe/infer/score.h"
#include "moe/infer/token_logprobs.h"
#include "moe/io/checkpoint.h"
#include "moe/models/transformer.h"
#include "support/gradcheck.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;

namespace {

// log softmax(row)[id] as the definition reads, in long double.
double direct_logprob(const float* row, int64_t vocab, int64_t id) {
  long double z = 0;
  for (int64_t v = 0; v < vocab; ++v) z += std::exp(static_cast<long double>(row[v]));
  return static_cast<double>(std::log(std::exp(static_cast<long double>(row[id])) / z));
}

}  // namespace

TEST_CASE("token_logprob: log-softmax, rank, greedy and top-n of one row", "[infer][logprob]") {
  const float row[] = {0.5f, 2.0f, -1.0f, 2.0f, 1.25f};
  for (int32_t id = 0; id < 5; ++id) {
    const infer::TokenLogprob t = infer::token_logprob(row, 5, id, 3);
    // Both in (at least) double from the same floats: they differ by a few ulp of log Z ~ 3.
    REQUIRE(std::fabs(t.logprob - direct_logprob(row, 5, id)) <= 1e-14);
    REQUIRE(t.id == id);
    REQUIRE(t.top_ids == std::vector<int32_t>{1, 3, 4});  // the tie at 2.0: the lower id first
    REQUIRE(t.top_logprobs.size() == 3);
    REQUIRE(std::fabs(t.top_logprobs[2] - direct_logprob(row, 5, 4)) <= 1e-14);
  }
  REQUIRE(infer::token_logprob(row, 5, 2).rank == 5);
  REQUIRE(infer::token_logprob(row, 5, 4).rank == 3);
  REQUIRE(infer::token_logprob(row, 5, 3).rank == 1);  // tied with token 1: both rank 1
  REQUIRE(infer::token_logprob(row, 5, 1).greedy);     // the first maximum, as greedy picks
  REQUIRE_FALSE(infer::token_logprob(row, 5, 3).greedy);
  REQUIRE(infer::token_logprob(row, 5, 0).top_ids.empty());
  REQUIRE_THROWS_AS(infer::token_logprob(row, 5, 5), Error);
  REQUIRE_THROWS_AS(infer::token_logprob(row, 5, 0, 6), Error);
}

TEST_CASE("evaluate: logit_rows sees every row of logits once, in order", "[infer][logprob]") {
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.resolve();
  ParamSet params(4, DType::f32);
  Transformer model(c, params);
  const int64_t batch = 3, n = batch * c.seq;  // 96 rows in blocks of at most 20: 5 of 20 or less
  const Tensor ids = test::random_ids({batch, c.seq}, 5, int32_t(c.vocab_size));
  const Tensor targets = test::random_ids({batch, c.seq}, 6, int32_t(c.vocab_size));
  Tensor row_nll;
  EvalOptions options;
  options.row_nll = &row_nll;
  options.logit_block_rows = 20;
  std::vector<double> logprobs;
  int64_t blocks = 0;
  options.logit_rows = [&](const Tensor& logits, int64_t first) {
    REQUIRE(first == static_cast<int64_t>(logprobs.size()));
    REQUIRE(logits.dim(0) <= 20);
    REQUIRE(logits.dim(1) == c.vocab_size);
    for (int64_t i = 0; i < logits.dim(0); ++i)
      logprobs.push_back(infer::token_logprob(logits.data<float>() + i * c.vocab_size, c.vocab_size,
                                              targets.data<int32_t>()[first + i])
                             .logprob);
    ++blocks;
  };
  model.evaluate(ids, targets, options);
  REQUIRE(blocks == 5);
  REQUIRE(static_cast<int64_t>(logprobs.size()) == n);
  const Tensor whole = model.logits(ids);
  for (int64_t i = 0; i < n; ++i) {
    INFO("row " << i);
    // The same rows through the same head in products of 20 rows instead of 96: a logit moves by
    // at most D u sum |h_i w_i| (below 4e-6 here, test_inference_blocks.cpp), a log-softmax by at
    // most twice its logits' largest move: 1e-5.
    const double direct = direct_logprob(whole.data<float>() + i * c.vocab_size, c.vocab_size,
                                         targets.data<int32_t>()[i]);
    REQUIRE(std::fabs(logprobs[static_cast<size_t>(i)] - direct) <= 1e-5);
    // The loss kernel's float NLL of the same logits: a few float ulp of log Z (~ 5.5): 1e-5.
    REQUIRE(std::fabs(logprobs[static_cast<size_t>(i)] + row_nll.data<float>()[i]) <= 1e-5);
  }
}

TEST_CASE("score --per-token: every predicted token, summing to minus the window's NLL",
          "[infer][logprob]") {
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.resolve();
  test::ScratchDir dir("unit-token-logprobs");
  const std::string model_path = dir / "model.h5", data = dir / "data.u16";
  io::save_checkpoint(model_path, test::initial_checkpoint(c, 11));
  const int64_t windows = 3;
  const Tensor tokens = test::random_ids({windows * c.seq + 1}, 12, int32_t(c.vocab_size));
  std::vector<uint16_t> u16(tokens.data<int32_t>(), tokens.data<int32_t>() + tokens.numel());
  std::ofstream(data, std::ios::binary)
      .write(reinterpret_cast<const char*>(u16.data()), std::streamsize(u16.size() * 2));
  infer::EngineOptions eo;
  eo.model = model_path;
  const auto engine = infer::Engine::open(eo, comm::make_local());
  ParamSet params(11, DType::f32);
  Transformer same(c, params);  // the checkpoint's model, for the direct computation
  for (const bool incremental : {false, true}) {
    DYNAMIC_SECTION((incremental ? "incremental" : "full pass")) {
      infer::ScoreOptions so;
      so.data = data;
      so.batch = 2;  // two rounds: windows 0-1, then 2
      so.per_token = true;
      so.top = 4;
      so.incremental = incremental;
      std::vector<infer::SequenceScore> scores;
      infer::ScoreCallbacks cb;
      cb.sequence = [&](const infer::SequenceScore& s) { scores.push_back(s); };
      infer::score(*engine, so, cb);
      REQUIRE(static_cast<int64_t>(scores.size()) == windows);
      for (const infer::SequenceScore& s : scores) {
        INFO("window " << s.index);
        REQUIRE(static_cast<int64_t>(s.per_token.size()) == c.seq);
        const Tensor window = Tensor::from_vector(
            {1, c.seq}, std::vector<int32_t>(tokens.data<int32_t>() + s.index * c.seq,
                                             tokens.data<int32_t>() + (s.index + 1) * c.seq));
        const Tensor logits = same.logits(window);
        double sum = 0;
        for (int64_t t = 0; t < c.seq; ++t) {
          const infer::TokenLogprob& p = s.per_token[static_cast<size_t>(t)];
          REQUIRE(p.id == tokens.data<int32_t>()[s.index * c.seq + t + 1]);
          const float* row = logits.data<float>() + t * c.vocab_size;
          // A window alone against windows in pairs (or a token at a time through the cache):
          // the products' rows differ, a logit by below 4e-6 (above), a log-prob by twice that.
          REQUIRE(std::fabs(p.logprob - direct_logprob(row, c.vocab_size, p.id)) <= 1e-5);
          REQUIRE(p.top_ids.size() == 4);
          REQUIRE(p.rank >= 1);
          REQUIRE((p.rank == 1) == (p.logprob >= p.top_logprobs[0]));
          sum += p.logprob;
        }
        // Each of the 32 tokens within 1e-5 of the loss kernel's float NLL (above): 32e-5.
        REQUIRE(std::fabs(sum + s.nll_sum) <= 32e-5);
      }
    }
  }
}
