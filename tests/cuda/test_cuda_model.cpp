// [cuda] The whole model on a GPU against the CPU: one forward/backward gives the CPU's losses and
// every parameter gradient, and a short AdamW training run on one GPU follows the CPU's losses.
#include <catch2/catch.hpp>
#include <cmath>

#include "moe/models/transformer.h"
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
// losses and every parameter's gradient.
void check_model_on_gpu(const ModelConfig& config) {
  ParamSet cpu_ps(7), gpu_ps(7);
  Transformer cpu_model(config, cpu_ps), gpu_model(config, gpu_ps);
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
