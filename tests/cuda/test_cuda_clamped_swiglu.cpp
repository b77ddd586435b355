// [cuda] The experts' clamped SwiGLU (gpt-oss) and its backward on a GPU against the CPU backend on
// the same host inputs, with per-expert biases, values on both sides of the clamps.
// Shapes: M rows of the permuted buffer, F hidden width, E experts.
#include <catch2/catch.hpp>
#include <vector>

#include "moe/cuda.h"
#include "moe/ops/moe.h"
#include "support/cuda.h"
#include "support/gradcheck.h"

using namespace moe;

TEST_CASE("cuda: the clamped swiglu and its gradient match the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const Device gpu{Device::cuda, 0};
  const SwigluClamp clamp{1.702f, 1.5f};  // random values of scale 3 fall on both sides
  const std::vector<int32_t> offsets{0, 17, 17, 60, 61};
  const int64_t E = 4, M = 61, F = 83;
  Tensor h0 = test::random_tensor({M, F}, 11, 3.0f), h3 = test::random_tensor({M, F}, 12, 3.0f);
  Tensor bias = test::random_tensor({E, F}, 13), da = test::random_tensor({M, F}, 14);
  Tensor h = h0.clone(), a = Tensor::empty({M, F});
  Tensor gh = h0.to(gpu), ga = Tensor::empty({M, F}, DType::f32, gpu);
  ops::expert_activation(h, h3, bias, offsets, Activation::swiglu_clamped, a, clamp);
  ops::expert_activation(gh, h3.to(gpu), bias.to(gpu), offsets, Activation::swiglu_clamped, ga,
                         clamp);
  // The same kernels:: row body and exp_f; the tolerances of the other expert activations
  // (test_cuda_moe.cpp), which leave room for the device's division.
  CHECK(gh.to_vector() == h.to_vector());  // h + bias: one add
  CHECK(test::normalised_error(ga.to_vector(), a.to_vector()) <= 1e-5);
  Tensor dh = Tensor::empty({M, F}), dh3 = Tensor::empty({M, F});
  Tensor gdh = Tensor::empty({M, F}, DType::f32, gpu),
         gdh3 = Tensor::empty({M, F}, DType::f32, gpu);
  ops::expert_activation_backward(da, h, h3, Activation::swiglu_clamped, dh, dh3, clamp);
  ops::expert_activation_backward(da.to(gpu), h.to(gpu), h3.to(gpu), Activation::swiglu_clamped,
                                  gdh, gdh3, clamp);
  CHECK(test::normalised_error(gdh.to_vector(), dh.to_vector()) <= 1e-5);
  CHECK(test::normalised_error(gdh3.to_vector(), dh3.to_vector()) <= 1e-5);
}
