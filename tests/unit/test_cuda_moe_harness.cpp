// The CUDA MoE, distillation-loss and AdamW kernels' index mapping, run on the CPU over odd grids
// (run_grid_on_cpu) and compared with the CPU backend. The same bodies run on the GPU
// (backend/cuda/{router,dispatch,grouped_gemm,distill_loss,adamw}.cu). Shapes: N tokens, D width,
// E experts, k choices per token, M kept slots.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "backend/cuda/adamw.cuh"
#include "backend/cuda/dispatch.cuh"
#include "backend/cuda/distill_loss.cuh"
#include "backend/cuda/grouped_gemm.cuh"
#include "backend/cuda/router.cuh"
#include "moe/nn/common.h"
#include "moe/ops/distill.h"
#include "moe/ops/moe.h"
#include "moe/optim/adamw.h"
#include "support/cuda.h"
#include "support/gradcheck.h"

using namespace moe;
namespace body = moe::cuda::body;

namespace {

std::vector<float> values(const Tensor& t) { return t.to_vector(); }

// The router backward's coefficients as the ops compute them on the host, for aux_scale 0.01 and
// z_scale 0.001 over N tokens (the load counts those N).
std::vector<float> aux_coefficients(const std::vector<int64_t>& load, int64_t N, int64_t k) {
  const auto E = static_cast<int64_t>(load.size());
  std::vector<float> coef(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    coef[e] = static_cast<float>(static_cast<double>(0.01f) * E * static_cast<double>(load[e]) /
                                 (static_cast<double>(N) * k * N));
  return coef;
}
float z_factor_of(int64_t N) { return static_cast<float>(2.0 * 0.001f / static_cast<double>(N)); }

}  // namespace

TEST_CASE("cuda harness: router jitter, softmax, top-k and backward match the CPU ops",
          "[cuda-harness]") {
  const int64_t N = 37, D = 13, E = 7, k = 3;
  Tensor x = test::random_tensor({N, D}, 1);
  Tensor noise = Tensor::empty({N, D}), routed = Tensor::empty({N, D});
  ops::router_jitter(x, 0.05f, 1234, noise, routed, 5);
  Tensor dx = test::random_tensor({N, D}, 2), dx_ref = dx.clone();
  ops::router_jitter_backward(noise, dx_ref);

  Tensor logits = test::router_logits(N, E, 3);
  Tensor probs = Tensor::empty({N, E}), lse = Tensor::empty({N});
  ops::router_softmax(logits, probs, lse);
  for (bool normalize : {false, true}) {
    INFO("normalize " << normalize);
    Tensor idx = Tensor::empty({N, k}, DType::i32), w = Tensor::empty({N, k});
    ops::router_topk(probs, k, normalize, idx, w);
    std::vector<int64_t> load = ops::router_load(idx, E);
    Tensor dw = test::random_tensor({N, k}, 4);
    Tensor dlogits = Tensor::empty({N, E});
    ops::router_backward(probs, lse, idx, dw, normalize, load, N, 0.01f, 0.001f, dlogits);
    const std::vector<float> coef = aux_coefficients(load, N, k);
    const float z_factor = z_factor_of(N);

    for (auto shape : test::kHarnessGrids) {
      std::vector<float> xs = values(x), ns(N * D, -1), rs(N * D, -1);
      cuda::run_grid_on_cpu<body::RouterJitter>(shape, static_cast<const float*>(xs.data()), 0.05f,
                                                uint64_t{1234}, ns.data(), rs.data(), int64_t{5}, D,
                                                N * D);
      REQUIRE(ns == values(noise));
      REQUIRE(rs == values(routed));
      std::vector<float> g = values(dx);
      cuda::run_grid_on_cpu<body::RouterJitterBackward>(shape, static_cast<const float*>(ns.data()),
                                                        g.data(), N * D);
      REQUIRE(g == values(dx_ref));

      std::vector<float> ls = values(logits), ps(N * E, -1), zs(N, -1);
      cuda::run_grid_on_cpu<body::RouterSoftmax>(shape, static_cast<const float*>(ls.data()),
                                                 ps.data(), zs.data(), N, E);
      REQUIRE(ps == values(probs));
      REQUIRE(zs == values(lse));

      std::vector<int32_t> is(N * k, -2);
      std::vector<float> ws(N * k, -1);
      cuda::run_grid_on_cpu<body::RouterTopk>(
          shape, static_cast<const float*>(ps.data()), N, E, k, normalize, is.data(), ws.data(),
          static_cast<const float*>(nullptr), int64_t{1}, int64_t{1});
      REQUIRE(is == test::int_values(idx));
      REQUIRE(ws == values(w));

      std::vector<float> dws = values(dw), dl(N * E, -1);
      cuda::run_grid_on_cpu<body::RouterBackward>(
          shape, static_cast<const float*>(ps.data()), static_cast<const float*>(zs.data()),
          static_cast<const int32_t*>(is.data()), static_cast<const float*>(dws.data()), N, E, k,
          normalize, static_cast<const float*>(coef.data()), z_factor, dl.data());
      REQUIRE(dl == values(dlogits));
    }
  }
}

TEST_CASE(
    "cuda harness: sigmoid scoring, biased top-k, their backward and the gate's sigmoid "
    "match the CPU ops",
    "[cuda-harness]") {
  const int64_t N = 31, E = 7, k = 2;
  Tensor logits = test::router_logits(N, E, 13);
  Tensor scores = Tensor::empty({N, E}), probs = Tensor::empty({N, E}), lse = Tensor::empty({N});
  ops::router_sigmoid(logits, scores, probs, lse);
  Tensor bias = test::random_tensor({E}, 14);
  Tensor y = Tensor::empty({N, E}), dx = Tensor::empty({N, E});
  Tensor dy = test::random_tensor({N, E}, 16);
  ops::sigmoid(logits, y);
  ops::sigmoid_backward(dy, y, dx);
  for (bool normalize : {false, true}) {
    INFO("normalize " << normalize);
    Tensor idx = Tensor::empty({N, k}, DType::i32), w = Tensor::empty({N, k});
    ops::router_topk(scores, k, normalize, idx, w, bias);
    const std::vector<int64_t> load = ops::router_load(idx, E);
    Tensor dw = test::random_tensor({N, k}, 15);
    Tensor dlogits = Tensor::empty({N, E});
    ops::router_backward_sigmoid(scores, logits, lse, idx, dw, normalize, load, N, 0.01f, 0.001f,
                                 dlogits);
    const std::vector<float> coef = aux_coefficients(load, N, k);
    const float z_factor = z_factor_of(N);
    for (auto shape : test::kHarnessGrids) {
      const std::vector<float> ls = values(logits), bs = values(bias), dws = values(dw);
      std::vector<float> ss(N * E, -1), ps(N * E, -1), zs(N, -1);
      cuda::run_grid_on_cpu<body::RouterSigmoid>(shape, static_cast<const float*>(ls.data()),
                                                 ss.data(), ps.data(), zs.data(), N, E);
      REQUIRE(ss == values(scores));
      REQUIRE(ps == values(probs));
      REQUIRE(zs == values(lse));
      std::vector<int32_t> is(N * k, -2);
      std::vector<float> ws(N * k, -1);
      cuda::run_grid_on_cpu<body::RouterTopk>(
          shape, static_cast<const float*>(ss.data()), N, E, k, normalize, is.data(), ws.data(),
          static_cast<const float*>(bs.data()), int64_t{1}, int64_t{1});
      REQUIRE(is == test::int_values(idx));
      REQUIRE(ws == values(w));
      std::vector<float> dl(N * E, -1);
      cuda::run_grid_on_cpu<body::RouterBackwardSigmoid>(
          shape, static_cast<const float*>(ss.data()), static_cast<const float*>(ls.data()),
          static_cast<const float*>(zs.data()), static_cast<const int32_t*>(is.data()),
          static_cast<const float*>(dws.data()), N, E, k, normalize,
          static_cast<const float*>(coef.data()), z_factor, dl.data());
      REQUIRE(dl == values(dlogits));
      std::vector<float> ys(N * E, -1), gs(N * E, -1);
      const std::vector<float> dys = values(dy);
      cuda::run_grid_on_cpu<body::Sigmoid>(shape, static_cast<const float*>(ls.data()), ys.data(),
                                           N * E);
      REQUIRE(ys == values(y));
      cuda::run_grid_on_cpu<body::SigmoidBackward>(shape, static_cast<const float*>(dys.data()),
                                                   static_cast<const float*>(ys.data()), gs.data(),
                                                   N * E);
      REQUIRE(gs == values(dx));
    }
  }
}

// A centred router's weight: the three bodies (projections and |c|^2, the shift, the update) give
// the CPU op's bits, for a nonzero center and for c = 0 (W' = W, -0 included); in place as well.
TEST_CASE("cuda harness: a centred router's weight matches the CPU op", "[cuda-harness]") {
  for (const auto& [E, D] : {std::pair<int64_t, int64_t>{8, 48}, {5, 33}, {1, 7}}) {
    INFO("E " << E << ", D " << D);
    Tensor w = test::random_tensor({E, D}, 31);
    w.data<float>()[0] = -0.0f;
    for (const bool zero : {false, true}) {
      INFO("zero center " << zero);
      Tensor c = zero ? Tensor::zeros({D}) : test::random_tensor({D}, 32);
      Tensor want = Tensor::empty({E, D});
      ops::router_center_weight(w, c, want);
      if (zero) REQUIRE(values(want) == values(w));
      if (!zero && E > 1) REQUIRE(values(want) != values(w));  // one expert: C W = 0
      Tensor in_place = w.clone();
      ops::router_center_weight(in_place, c, in_place);
      REQUIRE(values(in_place) == values(want));
      for (auto shape : test::kHarnessGrids) {
        const std::vector<float> ws = values(w), cs = values(c);
        std::vector<double> scratch(static_cast<size_t>(E + 1), -1.0);
        std::vector<float> k(static_cast<size_t>(E), -1.0f), out(static_cast<size_t>(E * D), -1.0f);
        cuda::run_grid_on_cpu<body::RouterCenterProject>(shape, ws.data(), cs.data(), E, D,
                                                         scratch.data());
        cuda::run_grid_on_cpu<body::RouterCenterShift>(
            shape, static_cast<const double*>(scratch.data()), E, k.data());
        cuda::run_grid_on_cpu<body::RouterCenterApply>(
            shape, ws.data(), cs.data(), static_cast<const double*>(scratch.data()),
            static_cast<const float*>(k.data()), E, D, out.data());
        REQUIRE(out == values(want));
        REQUIRE(std::signbit(out[0]) == std::signbit(values(want)[0]));
      }
    }
  }
}

TEST_CASE("cuda harness: gather, combine, their backward and slot_to_choice match the CPU ops",
          "[cuda-harness]") {
  const int64_t N = 29, D = 11, E = 5, k = 2;
  Tensor probs = Tensor::empty({N, E}), lse = Tensor::empty({N});
  ops::router_softmax(test::router_logits(N, E, 7), probs, lse);
  Tensor idx = Tensor::empty({N, k}, DType::i32), w = Tensor::empty({N, k});
  ops::router_topk(probs, k, true, idx, w);
  for (int64_t capacity : {int64_t{0}, int64_t{6}}) {  // dropless, and with dropped slots
    INFO("capacity " << capacity);
    ops::RoutingTable table = ops::build_routing(idx, w, E, capacity);
    const int64_t M = table.token_of_slot.numel();
    if (capacity > 0) REQUIRE(M < N * k);
    Tensor x = test::random_tensor({N, D}, 8);
    Tensor x_perm = Tensor::empty({M, D});
    ops::gather_rows(x, table.token_of_slot, x_perm);
    Tensor y_perm = test::random_tensor({M, D}, 9);
    Tensor y = Tensor::empty({N, D}), y1 = Tensor::empty({N, D});
    ops::combine_rows(y_perm, table.slot_of, table.weight_of_slot, k, y);
    ops::combine_rows(y_perm, table.slot_of, Tensor(), k, y1);
    Tensor dy = test::random_tensor({N, D}, 10);
    Tensor dy_perm = Tensor::empty({M, D}), dws = Tensor::empty({M});
    ops::combine_rows_backward(dy, y_perm, table.token_of_slot, table.weight_of_slot, dy_perm, dws);
    Tensor dtopk = Tensor::empty({N, k});
    ops::slot_to_choice(dws, table.slot_of, dtopk);

    const int32_t* tos = table.token_of_slot.data<int32_t>();
    const int32_t* so = table.slot_of.data<int32_t>();
    const float* wos = table.weight_of_slot.data<float>();
    std::vector<float> xs = values(x), yp = values(y_perm), dys = values(dy);
    for (auto shape : test::kHarnessGrids) {
      std::vector<float> xp(M * D, -1);
      cuda::run_grid_on_cpu<body::GatherRows>(shape, static_cast<const float*>(xs.data()), tos, N,
                                              D, xp.data(), M * D);
      REQUIRE(xp == values(x_perm));
      std::vector<float> out(N * D, -1), out1(N * D, -1);
      cuda::run_grid_on_cpu<body::CombineRows>(shape, static_cast<const float*>(yp.data()), so, wos,
                                               N, k, D, out.data());
      REQUIRE(out == values(y));
      cuda::run_grid_on_cpu<body::CombineRows>(shape, static_cast<const float*>(yp.data()), so,
                                               static_cast<const float*>(nullptr), N, k, D,
                                               out1.data());
      REQUIRE(out1 == values(y1));
      std::vector<float> dp(M * D, -1), dw(M, -1);
      cuda::run_grid_on_cpu<body::CombineRowsBackward>(shape, static_cast<const float*>(dys.data()),
                                                       static_cast<const float*>(yp.data()), tos,
                                                       wos, N, M, D, dp.data(), dw.data());
      REQUIRE(dp == values(dy_perm));
      REQUIRE(dw == values(dws));
      std::vector<float> dt(N * k, -1);
      cuda::run_grid_on_cpu<body::SlotToChoice>(shape, static_cast<const float*>(dw.data()), so, M,
                                                dt.data(), N * k);
      REQUIRE(dt == values(dtopk));
    }
  }
}

TEST_CASE("cuda harness: expert of row agrees with std::upper_bound, empty segments included",
          "[cuda-harness]") {
  const std::vector<int32_t> offsets{0, 0, 3, 3, 3, 4, 9, 9};
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1;
  for (int64_t row = 0; row < offsets.back(); ++row) {
    const int64_t expect =
        std::upper_bound(offsets.begin(), offsets.end(), static_cast<int32_t>(row)) -
        offsets.begin() - 1;
    REQUIRE(body::expert_of_row(offsets.data(), experts, row) == expect);
  }
}

TEST_CASE("cuda harness: expert bias, activation and their gradients match the CPU ops",
          "[cuda-harness]") {
  const std::vector<int32_t> offsets{0, 7, 7, 20, 21};  // an empty and a 1-row segment
  const int64_t E = 4, M = 21, F = 19;                  // F not a multiple of the CPU's lanes
  const int32_t* offs = offsets.data();
  Tensor h0 = test::random_tensor({M, F}, 11, 2.0f), h3 = test::random_tensor({M, F}, 12);
  Tensor bias = test::random_tensor({E, F}, 13);
  Tensor da = test::random_tensor({M, F}, 14);
  for (nn::Activation act : {nn::Activation::gelu, nn::Activation::swiglu}) {
    for (bool with_bias : {true, false}) {
      INFO("swiglu " << (act == nn::Activation::swiglu) << " bias " << with_bias);
      Tensor h = h0.clone(), a = Tensor::empty({M, F});
      ops::expert_activation(h, h3, with_bias ? bias : Tensor(), offsets, act, a);
      Tensor dh = Tensor::empty({M, F}), dh3 = Tensor::empty({M, F});
      ops::expert_activation_backward(da, h, h3, act, dh, dh3);
      const bool swiglu = act == nn::Activation::swiglu;
      std::vector<float> h3s = values(h3), bs = values(bias), das = values(da);
      for (auto shape : test::kHarnessGrids) {
        std::vector<float> hs = values(h0), as(M * F, -1);
        cuda::run_grid_on_cpu<body::ExpertActivation>(
            shape, hs.data(), swiglu ? static_cast<const float*>(h3s.data()) : nullptr,
            with_bias ? static_cast<const float*>(bs.data()) : nullptr, offs, E, F, as.data(),
            M * F);
        REQUIRE(hs == values(h));
        // Bitwise: GELU's tanh and SiLU's exp are kernels::tanh_f / exp_f on both sides.
        CHECK(as == values(a));
        std::vector<float> d(M * F, -1), d3(M * F, -1);
        cuda::run_grid_on_cpu<body::ExpertActivationBackward>(
            shape, static_cast<const float*>(das.data()), static_cast<const float*>(hs.data()),
            swiglu ? static_cast<const float*>(h3s.data()) : nullptr, d.data(),
            swiglu ? d3.data() : nullptr, M * F);
        CHECK(d == values(dh));
        if (swiglu) CHECK(d3 == values(dh3));
      }
    }
  }

  Tensor y = test::random_tensor({M, F}, 15), y_ref = y.clone();
  ops::grouped_add_bias(y_ref, bias, offsets);
  Tensor dbias0 = test::random_tensor({E, F}, 16), dbias = dbias0.clone();
  ops::grouped_bias_grad(da, offsets, dbias);
  for (auto shape : test::kHarnessGrids) {
    std::vector<float> ys = values(y), bs = values(bias);
    cuda::run_grid_on_cpu<body::GroupedAddBias>(
        shape, ys.data(), static_cast<const float*>(bs.data()), offs, E, F, M * F);
    REQUIRE(ys == values(y_ref));
    std::vector<float> das = values(da), db = values(dbias0);
    cuda::run_grid_on_cpu<body::GroupedBiasGrad>(shape, static_cast<const float*>(das.data()), offs,
                                                 E, F, db.data());
    REQUIRE(db == values(dbias));
  }
}

TEST_CASE("cuda harness: distillation loss rows and gradient match the CPU op", "[cuda-harness]") {
  const int64_t N = 23, V = 37;
  Tensor student = test::random_tensor({N, V}, 21, 3.0f);
  Tensor teacher = test::random_tensor({N, V}, 22, 3.0f);
  std::vector<int32_t> tg = test::int_values(test::random_ids({N}, 23, static_cast<int32_t>(V)));
  tg[0] = -1;  // ignored rows
  tg[5] = -100;
  tg[N - 1] = static_cast<int32_t>(V - 1);
  Tensor targets = Tensor::from_vector({N}, tg);
  const float T = 2.5f, ce_w = 0.3f, kd_w = 0.7f, scale = 0.5f;
  Tensor dlogits = Tensor::empty({N, V});
  const ops::DistillLossValue ref =
      ops::distill_loss(student, teacher, targets, T, ce_w, kd_w, &dlogits, scale);
  const float grad_scale = scale / static_cast<float>(ref.rows);
  std::vector<float> s = values(student), t = values(teacher);
  for (auto shape : test::kHarnessGrids) {
    for (bool with_grad : {true, false}) {
      std::vector<float> dx(N * V, -1);
      std::vector<kernels::DistillRow> rows(N, kernels::DistillRow{-1.0f, -1.0f});
      cuda::run_grid_on_cpu<body::DistillLossRows>(
          shape, static_cast<const float*>(s.data()), static_cast<const float*>(t.data()),
          static_cast<const int32_t*>(tg.data()), N, V, T, ce_w, kd_w,
          with_grad ? dx.data() : nullptr, grad_scale, rows.data());
      if (with_grad) REQUIRE(dx == values(dlogits));
      // The host's fp64 means in row order, as the op takes them.
      double ce = 0, kd = 0;
      for (int64_t i = 0; i < N; ++i) {
        if (tg[i] < 0) {
          REQUIRE(rows[i].ce == 0.0f);
          REQUIRE(rows[i].kd == 0.0f);
          continue;
        }
        ce += rows[i].ce;
        kd += rows[i].kd;
      }
      REQUIRE(ce / static_cast<double>(ref.rows) == ref.ce);
      REQUIRE(kd / static_cast<double>(ref.rows) == ref.kd);
    }
  }
}

TEST_CASE("cuda harness: AdamW update and gradient clipping match the optimizer",
          "[cuda-harness]") {
  ParamSet ps(5);
  Param& p = ps.add("w", {1001}, Init::normal(1.0f), /*decay=*/true);
  const std::vector<float> w0 = values(p.value);
  optim::AdamWConfig config;
  config.weight_decay = 0.1f;
  optim::AdamW opt(ps, config);
  std::vector<std::vector<float>> grads;
  for (int step = 1; step <= 3; ++step) {
    p.grad.copy_from(test::random_tensor({1001}, 30 + step));
    grads.push_back(values(p.grad));
    opt.step(1e-2f);
  }
  for (auto shape : test::kHarnessGrids) {
    std::vector<float> master = w0, m(1001, 0.0f), v(1001, 0.0f);
    for (int step = 1; step <= 3; ++step) {
      kernels::AdamWScalars sc{1e-2f,
                               config.beta1,
                               config.beta2,
                               config.eps,
                               config.weight_decay,
                               1.0f - std::pow(config.beta1, static_cast<float>(step)),
                               1.0f - std::pow(config.beta2, static_cast<float>(step))};
      cuda::run_grid_on_cpu<body::AdamWUpdate>(shape, master.data(), m.data(), v.data(),
                                               static_cast<const float*>(grads[step - 1].data()),
                                               sc, int64_t{1001});
    }
    REQUIRE(master == values(p.value));
  }

  Tensor g0 = test::random_tensor({1001}, 40, 10.0f);
  p.grad.copy_from(g0);
  const double max_norm = 1.0, norm = 300.0;
  optim::clip_gradients(ps, max_norm, norm);
  const float clip_scale = static_cast<float>(max_norm / (norm + 1e-6));
  for (auto shape : test::kHarnessGrids) {
    std::vector<float> g = values(g0);
    cuda::run_grid_on_cpu<body::ScaleInPlace>(shape, g.data(), clip_scale, int64_t{1001});
    REQUIRE(g == values(p.grad));
  }
}
