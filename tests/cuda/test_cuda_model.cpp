// [cuda] The whole model on a GPU against the CPU: one forward/backward gives the CPU's losses and
// every parameter gradient, and a short AdamW training run on one GPU follows the CPU's losses.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "moe/models/transformer.h"
#include "moe/nn/router.h"
#include "moe/ops/moe.h"
#include "moe/optim/adamw.h"
#include "support/cuda.h"
#include "support/gradcheck.h"
#include "support/models.h"

using namespace moe;
using namespace moe::optim;

namespace {

const Device kGpu{Device::cuda, 0};

ModelConfig config_of(Arch arch) {
  ModelConfig c = test::small_model_config(arch);
  c.aux_loss_coef = 0.01;
  c.z_loss_coef = 0.001;
  c.resolve();
  return c;
}

// One forward/backward (training mode, aux and z losses on) on the CPU and on the GPU: the same
// losses, every parameter's gradient and, for centred routers, the sums of their inputs. prepare,
// when given, edits each model's parameters (on the host) before the GPU's move there.
void check_model_on_gpu(const ModelConfig& config,
                        const std::function<void(ParamSet&)>& prepare = {}) {
  ParamSet cpu_ps(7), gpu_ps(7);
  Transformer cpu_model(config, cpu_ps), gpu_model(config, gpu_ps);
  if (prepare) {
    prepare(cpu_ps);
    prepare(gpu_ps);
  }
  gpu_ps.to(kGpu);
  Tensor ids = test::random_ids({2, config.seq}, 1, static_cast<int32_t>(config.vocab_size));
  Tensor targets = test::random_ids({2, config.seq}, 2, static_cast<int32_t>(config.vocab_size));
  nn::RouterStep step;
  step.training = true;
  cpu_ps.zero_grad();
  gpu_ps.zero_grad();
  ForwardStats a = cpu_model.forward_backward(ids, targets, step);
  ForwardStats b = gpu_model.forward_backward(ids.to(kGpu), targets.to(kGpu), step);
  CHECK(b.loss == Approx(a.loss).epsilon(1e-5));
  CHECK(b.aux_loss == Approx(a.aux_loss).epsilon(1e-4));
  CHECK(b.z_loss == Approx(a.z_loss).epsilon(1e-4));
  REQUIRE(b.moe.size() == a.moe.size());
  for (size_t l = 0; l < a.moe.size(); ++l) {
    CHECK(b.moe[l].input_tokens == a.moe[l].input_tokens);
    CHECK(b.moe[l].input_sum.size() == a.moe[l].input_sum.size());
    if (!a.moe[l].input_sum.empty()) {
      const std::vector<float> got(b.moe[l].input_sum.begin(), b.moe[l].input_sum.end()),
          want(a.moe[l].input_sum.begin(), a.moe[l].input_sum.end());
      CHECK(test::normalised_error(got, want) < 1e-5);
    }
  }
  for (Param* p : cpu_ps.all()) {
    DYNAMIC_SECTION(p->name) {
      const std::vector<float> got = gpu_ps.at(p->name).grad.to_vector(),
                               want = p->grad.to_vector();
      if (flavour_of(config).learned_positions && p->name.ends_with("attn.k.bias")) {
        // Without RoPE the key bias's exact gradient is zero (softmax cancels it): both devices
        // hold rounding noise, so the difference is measured against the key weight's gradient,
        // the scale of the terms that cancelled.
        const std::string weight = p->name.substr(0, p->name.size() - 4) + "weight";
        double diff = 0, scale = 1e-30;
        for (size_t i = 0; i < got.size(); ++i)
          diff = std::max(diff, double(std::fabs(got[i] - want[i])));
        for (float g : cpu_ps.at(weight).grad.to_vector())
          scale = std::max(scale, double(std::fabs(g)));
        CHECK(diff / scale < 1e-4);
      } else {
        CHECK(test::normalised_error(got, want) < 1e-4);
      }
    }
  }
}

}  // namespace

TEST_CASE("cuda: model forward/backward equals the CPU (gpt and mixtral)", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  for (Arch arch : {Arch::gpt, Arch::mixtral}) check_model_on_gpu(config_of(arch));
}

// The HF families' attention on the GPU: qk-norm through the rmsnorm ops over [N*H, hd] views
// (qwen3_moe, with head_dim 16 != D/H 8) and over the whole projections (olmoe), q/k/v biases
// without an o bias (qwen2_moe). One TEST_CASE per family: sections are named by parameter.
TEST_CASE("cuda: qwen3_moe (per-head qk-norm, head_dim 16) forward/backward equals the CPU",
          "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  ModelConfig c = config_of(Arch::qwen3_moe);
  c.head_dim = 16;
  c.validate();
  check_model_on_gpu(c);
}

TEST_CASE("cuda: olmoe (full-width qk-norm) forward/backward equals the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  check_model_on_gpu(config_of(Arch::olmoe));
}

TEST_CASE("cuda: qwen2_moe (q/k/v biases) forward/backward equals the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  check_model_on_gpu(config_of(Arch::qwen2_moe));
}

// Centred routers (W' = W - C (W c) c^T / |c|^2 with a nonzero center) under softmax scoring, and
// sigmoid scoring with a nonzero selection bias: W' and the gradient's projection are computed on
// the GPU (ops::router_center_weight), the bias acts through the router kernels' top-k. Then
// update_router_center and update_selection_bias edit GPU parameters through the host: the CPU's
// values.
TEST_CASE("cuda: centred routers and sigmoid routing with a selection bias equal the CPU",
          "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  {  // W' itself, computed on the GPU (sums in double in one order, no FMA): the CPU's bits
    const Tensor w = test::random_tensor({8, 72}, 41), c = test::random_tensor({72}, 42);
    Tensor want = Tensor::empty({8, 72}), got = Tensor::empty({8, 72}, DType::f32, kGpu);
    ops::router_center_weight(w, c, want);
    ops::router_center_weight(w.to(kGpu), c.to(kGpu), got);
    CHECK(got.to_vector() == want.to_vector());
  }
  for (const nn::RouterScoring scoring : {nn::RouterScoring::softmax, nn::RouterScoring::sigmoid}) {
    INFO("scoring " << router_scoring_name(scoring));
    ModelConfig c = test::small_model_config(Arch::mixtral);
    c.aux_loss_coef = 0.01;
    c.z_loss_coef = 0.001;
    c.router_center_rate = 0.5;
    c.router_scoring = scoring;
    c.resolve();
    REQUIRE(c.router_selection_bias() == (scoring == nn::RouterScoring::sigmoid));
    const auto prepare = [&](ParamSet& ps) {
      for (Param* p : ps.all()) {
        float* v = p->value.data<float>();
        if (p->name.ends_with("moe.router.center"))
          for (int64_t i = 0; i < p->numel(); ++i) v[i] = 0.05f * std::sin(1.0f + float(i));
        if (p->name.ends_with("moe.router.bias"))
          for (int64_t i = 0; i < p->numel(); ++i) v[i] = 0.02f * float(i % 3) - 0.02f;
        if (p->name.ends_with(".center") || p->name.ends_with("router.bias")) p->refresh_compute();
      }
    };
    check_model_on_gpu(c, prepare);

    ParamSet cpu_ps(7), gpu_ps(7);
    Transformer cpu_model(c, cpu_ps), gpu_model(c, gpu_ps);
    prepare(cpu_ps);
    prepare(gpu_ps);
    gpu_ps.to(kGpu);
    const std::vector<double> sum = {0.5, -1.25, 2.0, 0.125, -0.75, 1.0, 0.25, -2.5};
    const std::vector<int64_t> load = {3, 9, 5, 7};
    for (Param* p : cpu_ps.all()) {
      Param& g = gpu_ps.at(p->name);
      if (p->name.ends_with("moe.router.center")) {
        std::vector<double> s(static_cast<size_t>(p->numel()));
        for (size_t i = 0; i < s.size(); ++i) s[i] = sum[i % sum.size()] * double(i + 1);
        nn::update_router_center(*p, s, 6, c.router_center_rate);
        nn::update_router_center(g, s, 6, c.router_center_rate);
      } else if (p->name.ends_with("moe.router.bias")) {
        std::vector<int64_t> l(static_cast<size_t>(p->numel()));
        for (size_t i = 0; i < l.size(); ++i) l[i] = load[i % load.size()];
        nn::update_selection_bias(*p, l, 0.01);
        nn::update_selection_bias(g, l, 0.01);
      } else {
        continue;
      }
      INFO(p->name);
      CHECK(g.value.device() == kGpu);
      CHECK(g.w().to_vector() == p->w().to_vector());
    }
  }
}

TEST_CASE("cuda: a short training run on one GPU follows the CPU's losses", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const ModelConfig config = config_of(Arch::mixtral);
  ParamSet cpu_ps(3), gpu_ps(3);
  Transformer cpu_model(config, cpu_ps), gpu_model(config, gpu_ps);
  gpu_ps.to(kGpu);
  AdamWConfig opt;
  AdamW cpu_opt(cpu_ps, opt), gpu_opt(gpu_ps, opt);
  double first = 0, last = 0;
  for (int s = 0; s < 8; ++s) {
    Tensor ids = test::random_ids({4, config.seq}, 100 + s % 2, 64);
    Tensor targets = test::random_ids({4, config.seq}, 200 + s % 2, 64);
    nn::RouterStep step;
    step.training = true;
    step.step = s;
    cpu_ps.zero_grad();
    gpu_ps.zero_grad();
    ForwardStats a = cpu_model.forward_backward(ids, targets, step);
    ForwardStats b = gpu_model.forward_backward(ids.to(kGpu), targets.to(kGpu), step);
    CHECK(b.loss == Approx(a.loss).epsilon(1e-3));
    clip_grad_norm(cpu_ps, 1.0);
    clip_grad_norm(gpu_ps, 1.0);
    cpu_opt.step(1e-2f);
    gpu_opt.step(1e-2f);
    if (s == 0) first = b.loss;
    last = b.loss;
  }
  CHECK(last < first);
}
