// Inference holds bounded activations (issue 43): Transformer::evaluate makes the LM head's logits
// a block of rows at a time (never [N, V] at once) and runs each block's activations in a scratch
// that the next block reuses. The loss and per-token NLLs are those of the whole head.
#include <catch2/catch.hpp>
#include <cmath>

#include "moe/models/transformer.h"
#include "moe/nn/loss.h"
#include "support/gradcheck.h"
#include "support/models.h"

using namespace moe;

TEST_CASE("evaluate: logits by blocks of rows give the whole head's loss and row NLLs",
          "[infer][memory]") {
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.resolve();
  ParamSet params(4, DType::f32);
  Transformer model(c, params);
  // 12 windows of 32 tokens: 384 rows in blocks of at most 100: four blocks of 96.
  const int64_t batch = 12;
  const Tensor ids = test::random_ids({batch, c.seq}, 5, int32_t(c.vocab_size));
  Tensor targets = test::random_ids({batch, c.seq}, 6, int32_t(c.vocab_size));
  targets.data<int32_t>()[7] = -1;  // an ignored row: counted in neither mean
  Tensor row_nll;
  EvalOptions options;
  options.row_nll = &row_nll;
  options.logit_block_rows = 100;
  const ForwardStats blocks = model.evaluate(ids, targets, options);
  Tensor whole_nll;
  const double whole = nn::cross_entropy(model.logits(ids), targets.reshape({batch * c.seq}),
                                         nullptr, 1.0f, &whole_nll);
  // The same rows through the same head, in products of 96 rows instead of 384. A logit's fp32
  // rounding is at most D u sum |h_i w_i| (D 32 terms, RMS-normed h ~ 1, weights of std 0.02: below
  // 4e-6), an NLL moves by at most twice its logits' error: 1e-5 covers it.
  REQUIRE(row_nll.numel() == batch * c.seq);
  REQUIRE(row_nll.data<float>()[7] == 0.0f);
  for (int64_t i = 0; i < row_nll.numel(); ++i) {
    INFO("row " << i);
    REQUIRE(std::fabs(row_nll.data<float>()[i] - whole_nll.data<float>()[i]) <= 1e-5);
  }
  REQUIRE(std::fabs(blocks.loss - whole) <= 1e-5);
  REQUIRE(blocks.loss > 0);
}

TEST_CASE("evaluate: experts by blocks of tokens give the whole batch's routing and results",
          "[infer][memory]") {
  // Inference runs the MoE layers' experts (dispatch, experts, combine) a block of tokens at a
  // time from the whole batch's routing: the traces (choices, gate weights, loads) are the
  // batch's bit for bit, and each token's output is its own experts' rows, computed in products
  // of other row counts (a tile or the GEMV sums a row in another order): fp32 rounding of the
  // same sums, 1e-5 on an NLL as above.
  for (Arch arch : {Arch::mixtral, Arch::gpt}) {
    INFO(arch_name(arch));
    ModelConfig c = test::small_model_config(arch);
    c.resolve();
    ParamSet params(9, DType::f32);
    Transformer model(c, params);
    const int64_t batch = 12;
    const Tensor ids = test::random_ids({batch, c.seq}, 10, int32_t(c.vocab_size));
    const Tensor targets = test::random_ids({batch, c.seq}, 11, int32_t(c.vocab_size));
    Tensor whole_nll, blocks_nll;
    EvalOptions whole;
    whole.capture_routing = true;
    whole.row_nll = &whole_nll;
    EvalOptions blocks = whole;
    blocks.row_nll = &blocks_nll;
    blocks.expert_block_tokens = 100;  // 384 tokens: blocks of 100, 100, 100 and 84
    const ForwardStats a = model.evaluate(ids, targets, whole);
    const ForwardStats b = model.evaluate(ids, targets, blocks);
    REQUIRE(a.moe.size() == b.moe.size());
    for (size_t l = 0; l < a.moe.size(); ++l) {
      REQUIRE(a.moe[l].choices == b.moe[l].choices);
      REQUIRE(a.moe[l].gates == b.moe[l].gates);
      REQUIRE(a.moe[l].load == b.moe[l].load);
      REQUIRE(a.moe[l].rows_computed == b.moe[l].rows_computed);
    }
    for (int64_t i = 0; i < whole_nll.numel(); ++i) {
      INFO("row " << i);
      REQUIRE(std::fabs(whole_nll.data<float>()[i] - blocks_nll.data<float>()[i]) <= 1e-5);
    }
    REQUIRE(std::fabs(a.loss - b.loss) <= 1e-5);
  }
}
