// Finite differences through the whole model: embedding, blocks (attention, dense MLP, MoE),
// final norm, head, cross-entropy plus the aux and z losses. Top-k = E keeps the routing choice
// fixed under perturbation (the MoE layer's own checks cover k < E with drops).
#include <catch2/catch.hpp>

#include "moe/models/transformer.h"
#include "moe/rng.h"
#include "support/gradcheck.h"

using namespace moe;

namespace {

ModelConfig tiny(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 11;
  c.layers = 2;
  c.d_model = 8;
  c.heads = 2;
  c.kv_heads = arch == Arch::mixtral ? 1 : 0;
  c.d_ff = 12;
  c.seq = 5;
  c.experts = 3;
  c.moe_every = 2;  // layer 0 dense, layer 1 MoE
  c.top_k = 3;
  c.aux_loss_coef = 0.5;  // large, so a wrong aux gradient shows
  c.z_loss_coef = 0.1;
  c.normalize_topk = arch == Arch::mixtral;
  c.resolve();
  return c;
}

void check_model(const ModelConfig& config) {
  ParamSet ps(5);
  Transformer model(config, ps);
  Tensor ids = test::random_ids({2, config.seq}, 1, static_cast<int32_t>(config.vocab_size));
  Tensor targets = test::random_ids({2, config.seq}, 2, static_cast<int32_t>(config.vocab_size));
  nn::RouterStep step;
  step.training = false;  // no jitter
  ps.zero_grad();
  ForwardStats s = model.forward_backward(ids, targets, step);
  REQUIRE(std::isfinite(s.total));
  REQUIRE(s.aux_loss > 0);
  // Bigger weights than init so every path carries a visible gradient.
  for (Param* p : ps.all()) {
    if (p->name.find("norm") != std::string::npos) continue;
    p->value.copy_from(test::random_tensor(p->value.shape(), hash_name(p->name), 0.3f));
    p->refresh_compute();
  }
  ps.zero_grad();
  model.forward_backward(ids, targets, step);
  for (Param* p : ps.all()) {
    // Without RoPE (gpt) the key bias shifts every score of a query's row equally: softmax
    // cancels it, its gradient is exactly zero and finite differences only see rounding noise.
    // With RoPE (qwen2_moe) it is rotated by the key's position and has a real gradient.
    if (p->name.ends_with("attn.k.bias") && config.arch == Arch::gpt) continue;
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

TEST_CASE("model: whole gpt model gradient matches finite differences", "[gradcheck][model]") {
  check_model(tiny(Arch::gpt));
}

TEST_CASE("model: whole mixtral model (GQA, RoPE, SwiGLU) gradient matches finite differences",
          "[gradcheck][model]") {
  check_model(tiny(Arch::mixtral));
}

TEST_CASE("model: residual MoE (dense MLP + one expert) gradient matches finite differences",
          "[gradcheck][model]") {
  ModelConfig c = tiny(Arch::gpt);
  c.residual_moe = true;
  c.experts_per_layer = {0, 1};
  c.validate();
  check_model(c);
}

// The HF families' attention through the whole model: tiny() with one kv head (GQA) and
// head_dim `hd` (0: D/H). One TEST_CASE each: check_model's sections are named by parameter.
namespace {

ModelConfig family(Arch arch, int64_t hd) {
  ModelConfig c = tiny(arch);
  c.kv_heads = 1;
  c.head_dim = hd;
  c.validate();
  return c;
}

}  // namespace

TEST_CASE(
    "model: qwen3_moe (per-head qk-norm, head_dim 6 != D/H 4) gradient matches finite "
    "differences",
    "[gradcheck][model]") {
  check_model(family(Arch::qwen3_moe, 6));
}

TEST_CASE("model: olmoe (full-width qk-norm) gradient matches finite differences",
          "[gradcheck][model]") {
  check_model(family(Arch::olmoe, 0));
}

TEST_CASE("model: qwen2_moe (q/k/v biases, no o bias) gradient matches finite differences",
          "[gradcheck][model]") {
  check_model(family(Arch::qwen2_moe, 0));
}
