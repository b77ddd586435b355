// Finite differences through whole models with issue 44's features: a sliding window on some
// layers (the mask in the forward, nothing of its own in the backward) and a tied LM head (one
// parameter, embed.tokens, whose gradient sums the embedding's and the head's). Top-k = E keeps
// the routing fixed under perturbation, as in test_model.cpp.
#include <catch2/catch.hpp>

#include "moe/models/transformer.h"
#include "moe/rng.h"
#include "support/gradcheck.h"

using namespace moe;

namespace {

ModelConfig tiny_mixtral() {
  ModelConfig c;
  c.arch = Arch::mixtral;
  c.vocab_size = 11;
  c.layers = 2;
  c.d_model = 8;
  c.heads = 2;
  c.kv_heads = 1;
  c.d_ff = 12;
  c.seq = 6;
  c.experts = 3;
  c.moe_every = 2;
  c.top_k = 3;
  c.aux_loss_coef = 0.5;
  c.z_loss_coef = 0.1;
  c.normalize_topk = true;
  return c;
}

void check_model(const ModelConfig& config) {
  ParamSet ps(5);
  Transformer model(config, ps);
  Tensor ids = test::random_ids({2, config.seq}, 1, static_cast<int32_t>(config.vocab_size));
  Tensor targets = test::random_ids({2, config.seq}, 2, static_cast<int32_t>(config.vocab_size));
  nn::RouterStep step;
  step.training = false;  // no jitter
  for (Param* p : ps.all()) {
    if (p->name.find("norm") != std::string::npos) continue;
    p->value.copy_from(test::random_tensor(p->value.shape(), hash_name(p->name), 0.3f));
    p->refresh_compute();
  }
  ps.zero_grad();
  model.forward_backward(ids, targets, step);
  for (Param* p : ps.all()) {
    DYNAMIC_SECTION(p->name) {
      Tensor analytic = p->grad.clone();
      auto loss = [&] {
        p->refresh_compute();
        return model.evaluate(ids, targets).total;
      };
      MOE_REQUIRE_GRAD(test::check_gradient(p->value, analytic, loss, 1e-2, 12), 2e-2);
      p->refresh_compute();
    }
  }
}

}  // namespace

TEST_CASE("model: mixtral with a sliding window on layer 1 matches finite differences",
          "[gradcheck][model][window]") {
  ModelConfig c = tiny_mixtral();
  c.sliding_window = 2;
  c.window_layers = {1};
  c.resolve();
  check_model(c);
}

TEST_CASE("model: mixtral with a tied head matches finite differences",
          "[gradcheck][model][tied]") {
  ModelConfig c = tiny_mixtral();
  c.tie_embeddings = true;
  c.resolve();
  ParamSet ps(5);
  Transformer model(c, ps);
  REQUIRE(ps.find("lm_head.weight") == nullptr);  // the head is the token table
  REQUIRE(ps.find("embed.tokens") != nullptr);
  check_model(c);
}
