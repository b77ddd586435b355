// [cuda] core ops and tensors on a GPU against the CPU backend.
#include <catch2/catch.hpp>

#include "moe/cuda.h"
#include "moe/ops/core.h"
#include "support/cuda.h"
#include "support/gradcheck.h"

using namespace moe;

namespace {
const Device kGpu{Device::cuda, 0};
}

TEST_CASE("cuda: tensors round-trip and convert on the device", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  Tensor x = test::random_tensor({37, 19}, 1);
  Tensor g = x.to(kGpu);
  REQUIRE(g.device() == kGpu);
  REQUIRE(g.to_vector() == x.to_vector());
  REQUIRE(g.to(DType::bf16).to_vector() == x.to(DType::bf16).to_vector());
  REQUIRE(g.to(DType::f16).to(DType::f32).to_vector() ==
          x.to(DType::f16).to(DType::f32).to_vector());
  Tensor z = Tensor::zeros({5, 3}, DType::f32, kGpu);
  REQUIRE(z.to_vector() == std::vector<float>(15, 0.0f));
  z.fill(1.5f);
  REQUIRE(z.to_vector() == std::vector<float>(15, 1.5f));
  Tensor c = g.clone();
  REQUIRE(c.to_vector() == x.to_vector());
  // Copies that convert across devices, both ways.
  Tensor host = Tensor::empty({37, 19}, DType::f32);
  host.copy_from(g.to(DType::bf16));
  REQUIRE(host.to_vector() == x.to(DType::bf16).to_vector());
  Tensor device_bf16 = Tensor::empty({37, 19}, DType::bf16, kGpu);
  device_bf16.copy_from(x);
  REQUIRE(device_bf16.to_vector() == x.to(DType::bf16).to_vector());
}

TEST_CASE("cuda: gemm in every transpose combination matches the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const int64_t m = 33, n = 47, k = 65;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      Tensor a = test::random_tensor(ta ? Shape{k, m} : Shape{m, k}, 10 + ta);
      Tensor b = test::random_tensor(tb ? Shape{n, k} : Shape{k, n}, 20 + tb);
      Tensor c = test::random_tensor({m, n}, 30);
      Tensor gc = c.to(kGpu);
      ops::gemm(a, ta, b, tb, c, 0.5f, 0.25f);
      ops::gemm(a.to(kGpu), ta, b.to(kGpu), tb, gc, 0.5f, 0.25f);
      CHECK(test::normalised_error(gc.to_vector(), c.to_vector()) < 1e-5);
    }
  }
}

TEST_CASE("cuda: axpy, round_to_dtype and sum_squares match the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  Tensor x = test::random_tensor({1000}, 3), y = test::random_tensor({1000}, 4);
  Tensor gy = y.to(kGpu);
  ops::axpy(-0.75f, x, y);
  ops::axpy(-0.75f, x.to(kGpu), gy);
  REQUIRE(gy.to_vector() == y.to_vector());
  Tensor gx = x.to(kGpu);
  ops::round_to_dtype(x, DType::bf16);
  ops::round_to_dtype(gx, DType::bf16);
  REQUIRE(gx.to_vector() == x.to_vector());
  REQUIRE(ops::sum_squares(gx) == Approx(ops::sum_squares(x)).epsilon(1e-12));
}

TEST_CASE("cuda: operands on different devices are refused by name", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  Tensor x = test::random_tensor({4}, 1), y = test::random_tensor({4}, 2).to(kGpu);
  REQUIRE_THROWS_WITH(ops::axpy(1.0f, x, y), Catch::Contains("different devices"));
}
