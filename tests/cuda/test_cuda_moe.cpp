// [cuda] MoE ops (router, routing table, dispatch / combine, grouped GEMM, expert bias and
// activation), the distillation loss and AdamW on a GPU against the CPU backend on the same host
// inputs. Shapes: N tokens, D width, F hidden width, E experts, k choices, M kept slots.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "moe/cuda.h"
#include "moe/nn/common.h"
#include "moe/ops/core.h"
#include "moe/ops/distill.h"
#include "moe/ops/moe.h"
#include "moe/optim/adamw.h"
#include "support/cuda.h"
#include "support/gradcheck.h"

using namespace moe;

namespace {

const Device kGpu{Device::cuda, 0};

}  // namespace

TEST_CASE("cuda: router ops match the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const int64_t N = 301, D = 67, E = 9, k = 2;
  Tensor x = test::random_tensor({N, D}, 1);
  Tensor noise = Tensor::empty({N, D}), routed = Tensor::empty({N, D});
  Tensor gnoise = Tensor::empty({N, D}, DType::f32, kGpu),
         grouted = Tensor::empty({N, D}, DType::f32, kGpu);
  ops::router_jitter(x, 0.1f, 77, noise, routed, 3);
  ops::router_jitter(x.to(kGpu), 0.1f, 77, gnoise, grouted, 3);
  REQUIRE(gnoise.to_vector() == noise.to_vector());  // the Philox bits and one affine map
  CHECK(test::normalised_error(grouted.to_vector(), routed.to_vector()) <= 1e-6);
  Tensor dx = test::random_tensor({N, D}, 2), gdx = dx.to(kGpu);
  ops::router_jitter_backward(noise, dx);
  ops::router_jitter_backward(gnoise, gdx);
  CHECK(test::normalised_error(gdx.to_vector(), dx.to_vector()) <= 1e-6);

  Tensor logits = test::router_logits(N, E, 3);
  Tensor probs = Tensor::empty({N, E}), lse = Tensor::empty({N});
  Tensor gprobs = Tensor::empty({N, E}, DType::f32, kGpu),
         glse = Tensor::empty({N}, DType::f32, kGpu);
  ops::router_softmax(logits, probs, lse);
  ops::router_softmax(logits.to(kGpu), gprobs, glse);
  CHECK(test::normalised_error(gprobs.to_vector(), probs.to_vector()) <= 1e-5);
  CHECK(test::normalised_error(glse.to_vector(), lse.to_vector()) <= 1e-5);

  for (bool normalize : {false, true}) {
    INFO("normalize " << normalize);
    // Top-k on the same probabilities on both sides (ties must break the same way).
    Tensor idx = Tensor::empty({N, k}, DType::i32), w = Tensor::empty({N, k});
    Tensor gidx = Tensor::empty({N, k}, DType::i32, kGpu),
           gw = Tensor::empty({N, k}, DType::f32, kGpu);
    ops::router_topk(probs, k, normalize, idx, w);
    ops::router_topk(probs.to(kGpu), k, normalize, gidx, gw);
    REQUIRE(test::int_values(gidx) == test::int_values(idx));
    CHECK(test::normalised_error(gw.to_vector(), w.to_vector()) <= 1e-6);

    const std::vector<int64_t> load = ops::router_load(idx, E);
    REQUIRE(ops::router_load(gidx, E) == load);
    REQUIRE(ops::router_aux_loss(probs.to(kGpu), load, N, k) ==
            ops::router_aux_loss(probs, load, N, k));
    REQUIRE(ops::router_z_loss(lse.to(kGpu)) == ops::router_z_loss(lse));

    Tensor dw = test::random_tensor({N, k}, 4);
    Tensor dlogits = Tensor::empty({N, E}), gdlogits = Tensor::empty({N, E}, DType::f32, kGpu);
    ops::router_backward(probs, lse, idx, dw, normalize, load, N, 0.01f, 0.001f, dlogits);
    ops::router_backward(probs.to(kGpu), lse.to(kGpu), gidx, dw.to(kGpu), normalize, load, N, 0.01f,
                         0.001f, gdlogits);
    CHECK(test::normalised_error(gdlogits.to_vector(), dlogits.to_vector()) <= 1e-5);
  }
}

TEST_CASE("cuda: routing table, dispatch and combine match the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const int64_t N = 203, D = 45, E = 6, k = 2;
  Tensor probs = Tensor::empty({N, E}), lse = Tensor::empty({N});
  ops::router_softmax(test::router_logits(N, E, 5), probs, lse);
  Tensor idx = Tensor::empty({N, k}, DType::i32), w = Tensor::empty({N, k});
  ops::router_topk(probs, k, true, idx, w);
  for (int64_t capacity : {int64_t{0}, int64_t{40}}) {
    INFO("capacity " << capacity);
    ops::RoutingTable table = ops::build_routing(idx, w, E, capacity);
    ops::RoutingTable gtable = ops::build_routing(idx.to(kGpu), w.to(kGpu), E, capacity);
    REQUIRE(gtable.slot_of.device() == kGpu);
    REQUIRE(gtable.token_of_slot.device() == kGpu);
    REQUIRE(gtable.weight_of_slot.device() == kGpu);
    REQUIRE(gtable.expert_offsets == table.expert_offsets);
    REQUIRE(gtable.tokens_per_expert == table.tokens_per_expert);
    REQUIRE(gtable.load == table.load);
    REQUIRE(test::int_values(gtable.slot_of) == test::int_values(table.slot_of));
    REQUIRE(test::int_values(gtable.token_of_slot) == test::int_values(table.token_of_slot));
    REQUIRE(gtable.weight_of_slot.to_vector() == table.weight_of_slot.to_vector());
    const int64_t M = table.token_of_slot.numel();

    Tensor x = test::random_tensor({N, D}, 6);
    Tensor x_perm = Tensor::empty({M, D}), gx_perm = Tensor::empty({M, D}, DType::f32, kGpu);
    ops::gather_rows(x, table.token_of_slot, x_perm);
    ops::gather_rows(x.to(kGpu), gtable.token_of_slot, gx_perm);
    REQUIRE(gx_perm.to_vector() == x_perm.to_vector());

    Tensor y_perm = test::random_tensor({M, D}, 7);
    for (bool weighted : {true, false}) {
      Tensor y = Tensor::empty({N, D}), gy = Tensor::empty({N, D}, DType::f32, kGpu);
      ops::combine_rows(y_perm, table.slot_of, weighted ? table.weight_of_slot : Tensor(), k, y);
      ops::combine_rows(y_perm.to(kGpu), gtable.slot_of,
                        weighted ? gtable.weight_of_slot : Tensor(), k, gy);
      CHECK(test::normalised_error(gy.to_vector(), y.to_vector()) <= 1e-5);
    }

    Tensor dy = test::random_tensor({N, D}, 8);
    Tensor dy_perm = Tensor::empty({M, D}), dws = Tensor::empty({M});
    Tensor gdy_perm = Tensor::empty({M, D}, DType::f32, kGpu),
           gdws = Tensor::empty({M}, DType::f32, kGpu);
    ops::combine_rows_backward(dy, y_perm, table.token_of_slot, table.weight_of_slot, dy_perm, dws);
    ops::combine_rows_backward(dy.to(kGpu), y_perm.to(kGpu), gtable.token_of_slot,
                               gtable.weight_of_slot, gdy_perm, gdws);
    CHECK(test::normalised_error(gdy_perm.to_vector(), dy_perm.to_vector()) <= 1e-6);
    CHECK(test::normalised_error(gdws.to_vector(), dws.to_vector()) <= 1e-5);

    Tensor dtopk = Tensor::empty({N, k}), gdtopk = Tensor::empty({N, k}, DType::f32, kGpu);
    ops::slot_to_choice(dws, table.slot_of, dtopk);
    ops::slot_to_choice(dws.to(kGpu), gtable.slot_of, gdtopk);
    REQUIRE(gdtopk.to_vector() == dtopk.to_vector());
  }
}

TEST_CASE("cuda: grouped GEMM and its weight gradient match the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const std::vector<int32_t> offsets{0, 70, 70, 201, 203};  // an empty and a 2-row segment
  const int64_t E = 4, M = 203, N = 24;
  for (int64_t K : {40, 100}) {
    for (bool transpose_w : {true, false}) {
      INFO("K " << K << " transpose_w " << transpose_w);
      Tensor a = test::random_tensor({M, K}, 1);
      Tensor w = test::random_tensor(transpose_w ? Shape{E, N, K} : Shape{E, K, N}, 2);
      Tensor c = test::random_tensor({M, N}, 3), gc = c.to(kGpu);
      ops::grouped_gemm(a, w, transpose_w, offsets, c, 0.5f);
      ops::grouped_gemm(a.to(kGpu), w.to(kGpu), transpose_w, offsets, gc, 0.5f);
      CHECK(test::normalised_error(gc.to_vector(), c.to_vector()) <= 1e-5);

      // dW [E,N,K] += dY^T X over each segment, accumulating into a nonzero dW.
      Tensor dy = test::random_tensor({M, N}, 4);
      Tensor dw = test::random_tensor({E, N, K}, 5), gdw = dw.to(kGpu);
      ops::grouped_gemm_weight_grad(dy, a, offsets, dw);
      ops::grouped_gemm_weight_grad(dy.to(kGpu), a.to(kGpu), offsets, gdw);
      CHECK(test::normalised_error(gdw.to_vector(), dw.to_vector()) <= 1e-5);
    }
  }
}

// The segments run on several streams (cuda::set_expert_streams); each segment's cuBLAS call is
// the same on any of them, so the bits do not depend on the count. 64 experts of uneven sizes,
// some empty, and work queued before the call (it must wait for it) and after it (it must wait).
TEST_CASE("cuda: grouped GEMM gives the same bits on 1, 4 and 16 expert streams", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const int64_t E = 64, K = 96, N = 80;
  std::vector<int32_t> offsets{0};
  for (int64_t e = 0; e < E; ++e)
    offsets.push_back(offsets.back() + static_cast<int32_t>(e % 5 == 0 ? 0 : 3 + (e * 7) % 29));
  const int64_t M = offsets.back();
  Tensor a = test::random_tensor({M, K}, 21).to(kGpu),
         w = test::random_tensor({E, N, K}, 22).to(kGpu);
  Tensor dy = test::random_tensor({M, N}, 23).to(kGpu);
  const int before = cuda::expert_streams();
  std::vector<float> first_c, first_dw;
  for (int streams : {1, 4, 16}) {
    INFO("streams " << streams);
    cuda::set_expert_streams(streams);
    Tensor c = Tensor::zeros({M, N}, DType::f32, kGpu),
           dw = Tensor::zeros({E, N, K}, DType::f32, kGpu);
    ops::axpy(1.0f, test::random_tensor({M, N}, 24).to(kGpu), c);  // queued before, read by beta
    ops::grouped_gemm(a, w, true, offsets, c, 0.5f);
    ops::grouped_gemm_weight_grad(dy, a, offsets, dw);
    ops::scale(c, 2.0f);  // queued after: must see the finished products
    const std::vector<float> got_c = c.to_vector(), got_dw = dw.to_vector();
    if (first_c.empty()) {  // one stream: the products the CPU computes
      Tensor cc = test::random_tensor({M, N}, 24), cdw = Tensor::zeros({E, N, K});
      ops::grouped_gemm(a.to(Device{}), w.to(Device{}), true, offsets, cc, 0.5f);
      ops::grouped_gemm_weight_grad(dy.to(Device{}), a.to(Device{}), offsets, cdw);
      ops::scale(cc, 2.0f);
      CHECK(test::normalised_error(got_c, cc.to_vector()) <= 1e-5);
      CHECK(test::normalised_error(got_dw, cdw.to_vector()) <= 1e-5);
      first_c = got_c;
      first_dw = got_dw;
      continue;
    }
    CHECK(got_c == first_c);
    CHECK(got_dw == first_dw);
  }
  cuda::set_expert_streams(before);
  REQUIRE_THROWS_WITH(cuda::set_expert_streams(0), Catch::Contains("between 1 and 16"));
}

TEST_CASE("cuda: expert bias, activation and their gradients match the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const std::vector<int32_t> offsets{0, 17, 17, 60, 61};
  const int64_t E = 4, M = 61, F = 83;
  Tensor h0 = test::random_tensor({M, F}, 11, 2.0f), h3 = test::random_tensor({M, F}, 12);
  Tensor bias = test::random_tensor({E, F}, 13), da = test::random_tensor({M, F}, 14);
  for (nn::Activation act : {nn::Activation::gelu, nn::Activation::swiglu}) {
    for (bool with_bias : {true, false}) {
      INFO("swiglu " << (act == nn::Activation::swiglu) << " bias " << with_bias);
      Tensor h = h0.clone(), a = Tensor::empty({M, F});
      Tensor gh = h0.to(kGpu), ga = Tensor::empty({M, F}, DType::f32, kGpu);
      ops::expert_activation(h, h3, with_bias ? bias : Tensor(), offsets, act, a);
      ops::expert_activation(gh, h3.to(kGpu), with_bias ? bias.to(kGpu) : Tensor(), offsets, act,
                             ga);
      CHECK(test::normalised_error(gh.to_vector(), h.to_vector()) <= 1e-6);
      CHECK(test::normalised_error(ga.to_vector(), a.to_vector()) <= 1e-5);
      Tensor dh = Tensor::empty({M, F}), dh3 = Tensor::empty({M, F});
      Tensor gdh = Tensor::empty({M, F}, DType::f32, kGpu),
             gdh3 = Tensor::empty({M, F}, DType::f32, kGpu);
      ops::expert_activation_backward(da, h, h3, act, dh, dh3);
      ops::expert_activation_backward(da.to(kGpu), h.to(kGpu), h3.to(kGpu), act, gdh, gdh3);
      CHECK(test::normalised_error(gdh.to_vector(), dh.to_vector()) <= 1e-5);
      if (act == nn::Activation::swiglu)
        CHECK(test::normalised_error(gdh3.to_vector(), dh3.to_vector()) <= 1e-5);
    }
  }
  Tensor y = test::random_tensor({M, F}, 15), gy = y.to(kGpu);
  ops::grouped_add_bias(y, bias, offsets);
  ops::grouped_add_bias(gy, bias.to(kGpu), offsets);
  REQUIRE(gy.to_vector() == y.to_vector());
  Tensor db = test::random_tensor({E, F}, 16), gdb = db.to(kGpu);
  ops::grouped_bias_grad(da, offsets, db);
  ops::grouped_bias_grad(da.to(kGpu), offsets, gdb);
  REQUIRE(gdb.to_vector() == db.to_vector());  // the same additions in the same order
}

TEST_CASE("cuda: distillation loss and its gradient match the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const int64_t N = 97, V = 331;
  Tensor student = test::random_tensor({N, V}, 21, 3.0f);
  Tensor teacher = test::random_tensor({N, V}, 22, 3.0f);
  std::vector<int32_t> tg = test::int_values(test::random_ids({N}, 23, static_cast<int32_t>(V)));
  tg[0] = -1;
  tg[7] = -100;
  Tensor targets = Tensor::from_vector({N}, tg);
  Tensor d = Tensor::empty({N, V}), gd = Tensor::empty({N, V}, DType::f32, kGpu);
  const ops::DistillLossValue ref =
      ops::distill_loss(student, teacher, targets, 2.0f, 0.4f, 0.6f, &d, 0.5f);
  const ops::DistillLossValue got = ops::distill_loss(
      student.to(kGpu), teacher.to(kGpu), targets.to(kGpu), 2.0f, 0.4f, 0.6f, &gd, 0.5f);
  REQUIRE(got.rows == ref.rows);
  CHECK(got.ce == Approx(ref.ce).epsilon(1e-5));
  CHECK(got.kd == Approx(ref.kd).epsilon(1e-5));
  CHECK(got.total == Approx(ref.total).epsilon(1e-5));
  CHECK(test::normalised_error(gd.to_vector(), d.to_vector()) <= 1e-5);
  const std::vector<float> gdv = gd.to_vector();
  for (int64_t j = 0; j < V; ++j) REQUIRE(gdv[j] == 0.0f);  // ignored row 0

  tg[3] = static_cast<int32_t>(V);  // out of range: refused before any kernel runs
  REQUIRE_THROWS_WITH(ops::distill_loss(student.to(kGpu), teacher.to(kGpu),
                                        Tensor::from_vector({N}, tg).to(kGpu), 2.0f, 0.4f, 0.6f),
                      Catch::Contains("out of range"));
}

TEST_CASE("cuda: AdamW steps and gradient clipping on device parameters match the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  auto make = [](ParamSet& ps) -> Param& {
    return ps.add("w", {1001}, Init::normal(1.0f), /*decay=*/true);
  };
  ParamSet cpu_ps(5), gpu_ps(5);
  Param& pc = make(cpu_ps);
  Param& pg = make(gpu_ps);
  pg.value = pg.value.to(kGpu);
  pg.grad = pg.grad.to(kGpu);
  pg.refresh_compute();
  optim::AdamWConfig config;
  config.weight_decay = 0.1f;
  optim::AdamW cpu_opt(cpu_ps, config), gpu_opt(gpu_ps, config);
  for (int step = 1; step <= 3; ++step) {
    Tensor g = test::random_tensor({1001}, 30 + step, 5.0f);
    pc.grad.copy_from(g);
    pg.grad.copy_from(g.to(kGpu));
    const double norm_c = optim::clip_grad_norm(cpu_ps, 1.0);
    const double norm_g = optim::clip_grad_norm(gpu_ps, 1.0);
    CHECK(norm_g == Approx(norm_c).epsilon(1e-12));
    CHECK(test::normalised_error(pg.grad.to_vector(), pc.grad.to_vector()) <= 1e-6);
    cpu_opt.step(1e-2f);
    gpu_opt.step(1e-2f);
    REQUIRE(pg.value.device() == kGpu);
    CHECK(test::normalised_error(pg.value.to_vector(), pc.value.to_vector()) <= 1e-5);
  }
}
