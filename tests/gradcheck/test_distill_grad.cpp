// Finite differences of the distillation loss: d(loss)/d(student logits) for several alpha / T
// mixes (ignored targets included), and through a whole student model trained on it by
// Transformer::forward_backward with a LogitsLoss (the path moe-distill takes).
#include <catch2/catch.hpp>
#include <cmath>

#include "moe/models/transformer.h"
#include "moe/ops/distill.h"
#include "moe/rng.h"
#include "support/gradcheck.h"

using namespace moe;

namespace {

constexpr double kTolerance = 1e-2;

struct Mix {
  float ce_weight, kd_weight, temperature;
};

}  // namespace

TEST_CASE("distill: KD loss gradient w.r.t. student logits matches finite differences",
          "[distill][gradcheck]") {
  Tensor student = test::random_tensor({7, 10}, 21, 2.0f);
  Tensor teacher = test::random_tensor({7, 10}, 22, 3.0f);
  Tensor targets = Tensor::from_vector({7}, std::vector<int32_t>{3, -1, 0, 9, 5, -1, 1});
  // alpha CE + (1 - alpha) KD at various temperatures; pure CE; pure KD; a decayed KD weight.
  for (Mix mix : {Mix{0.5f, 0.5f, 1.0f}, Mix{0.3f, 0.7f, 2.5f}, Mix{0.9f, 0.1f, 0.5f},
                  Mix{1.0f, 0.0f, 1.0f}, Mix{0.0f, 1.0f, 4.0f}, Mix{0.8f, 0.2f, 1.7f}}) {
    DYNAMIC_SECTION("ce " << mix.ce_weight << " kd " << mix.kd_weight << " T " << mix.temperature) {
      auto loss = [&] {
        return ops::distill_loss(student, teacher, targets, mix.temperature, mix.ce_weight,
                                 mix.kd_weight)
            .total;
      };
      Tensor dlogits = Tensor::empty(student.shape());
      ops::distill_loss(student, teacher, targets, mix.temperature, mix.ce_weight, mix.kd_weight,
                        &dlogits);
      MOE_REQUIRE_GRAD(test::check_gradient(student, dlogits, loss, 1e-2, 70), kTolerance);
      // Ignored rows get exactly zero gradient.
      for (int64_t j = 0; j < 10; ++j) {
        REQUIRE(dlogits.data<float>()[1 * 10 + j] == 0.0f);
        REQUIRE(dlogits.data<float>()[5 * 10 + j] == 0.0f);
      }
      // `scale` multiplies the gradient only.
      Tensor scaled = Tensor::empty(student.shape());
      double a = ops::distill_loss(student, teacher, targets, mix.temperature, mix.ce_weight,
                                   mix.kd_weight, &scaled, 3.0f)
                     .total;
      REQUIRE(a == loss());
      for (int64_t i = 0; i < student.numel(); ++i)
        REQUIRE(scaled.data<float>()[i] == Approx(3.0f * dlogits.data<float>()[i]).margin(1e-7));
    }
  }
}

TEST_CASE(
    "distill: the KD term alone has the T * (p_student - p_teacher) gradient, zero at the "
    "teacher",
    "[distill][gradcheck]") {
  Tensor teacher = test::random_tensor({4, 6}, 31, 2.0f);
  Tensor targets = Tensor::from_vector({4}, std::vector<int32_t>{0, 1, 2, 3});
  // The student equal to the teacher is the minimum of the KL: loss and gradient vanish.
  Tensor same = teacher.clone();
  Tensor dlogits = Tensor::empty(same.shape());
  ops::DistillLossValue v = ops::distill_loss(same, teacher, targets, 2.0f, 0.0f, 1.0f, &dlogits);
  REQUIRE(v.kd == Approx(0.0).margin(1e-6));
  for (int64_t i = 0; i < dlogits.numel(); ++i)
    REQUIRE(dlogits.data<float>()[i] == Approx(0.0f).margin(1e-6));
  // Moving the student away makes both non-zero (the check above could not pass by accident).
  Tensor moved = test::random_tensor({4, 6}, 32, 2.0f);
  v = ops::distill_loss(moved, teacher, targets, 2.0f, 0.0f, 1.0f, &dlogits);
  REQUIRE(v.kd > 1e-3);
  REQUIRE(test::dot(dlogits, dlogits) > 1e-6);
}

TEST_CASE("distill: whole student model trained on the KD loss matches finite differences",
          "[distill][gradcheck]") {
  ModelConfig c;
  c.arch = Arch::gpt;
  c.vocab_size = 11;
  c.layers = 2;
  c.d_model = 8;
  c.heads = 2;
  c.d_ff = 12;
  c.seq = 5;
  c.experts = 3;
  c.moe_every = 2;
  c.top_k = 3;  // top-k = E: routing choices cannot flip under perturbation
  c.aux_loss_coef = 0.5;
  c.z_loss_coef = 0.1;
  c.resolve();
  ParamSet ps(5);
  Transformer model(c, ps);
  for (Param* p : ps.all()) {
    if (p->name.find("norm") != std::string::npos) continue;
    p->value.copy_from(test::random_tensor(p->value.shape(), hash_name(p->name), 0.3f));
    p->refresh_compute();
  }
  Tensor ids = test::random_ids({2, c.seq}, 1, static_cast<int32_t>(c.vocab_size));
  Tensor targets = test::random_ids({2, c.seq}, 2, static_cast<int32_t>(c.vocab_size));
  Tensor teacher = test::random_tensor({2 * c.seq, c.vocab_size}, 3, 2.0f);
  const float ce_weight = 0.4f, kd_weight = 0.6f, temperature = 2.0f;
  LogitsLoss kd = [&](const Tensor& batch, const Tensor& flat_targets, const Tensor& logits,
                      Tensor& dlogits) {
    REQUIRE(batch.shape() == ids.shape());
    return ops::distill_loss(logits, teacher, flat_targets, temperature, ce_weight, kd_weight,
                             &dlogits)
        .total;
  };
  nn::RouterStep step;
  step.training = false;
  ps.zero_grad();
  ForwardStats s = model.forward_backward(ids, targets, step, {}, kd);
  // What the model reports is the KD loss (plus aux and z), not the plain cross-entropy.
  const double expected =
      ops::distill_loss(model.logits(ids), teacher, targets.reshape({2 * c.seq}), temperature,
                        ce_weight, kd_weight)
          .total;
  REQUIRE(s.loss == Approx(expected).epsilon(1e-6));
  REQUIRE(s.loss != Approx(model.evaluate(ids, targets).loss).epsilon(1e-3));
  for (Param* p : ps.all()) {
    if (p->name.ends_with("attn.k.bias")) continue;  // exactly zero gradient (softmax shift)
    DYNAMIC_SECTION(p->name) {
      Tensor analytic = p->grad.clone();
      auto loss = [&] {
        p->refresh_compute();
        ForwardStats e = model.evaluate(ids, targets);  // aux and z losses
        return ops::distill_loss(model.logits(ids), teacher, targets.reshape({2 * c.seq}),
                                 temperature, ce_weight, kd_weight)
                   .total +
               c.aux_loss_coef * e.aux_loss + c.z_loss_coef * e.z_loss;
      };
      MOE_REQUIRE_GRAD(test::check_gradient(p->value, analytic, loss, 1e-2, 12), 2e-2);
      p->refresh_compute();
    }
  }
}
