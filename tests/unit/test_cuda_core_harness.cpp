// The CUDA core-op kernels' index mapping, run on the CPU over odd grids (run_grid_on_cpu) and
// compared with the CPU backend. The same bodies run on the GPU (backend/cuda/core_ops.cu).
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "backend/cuda/core_ops.cuh"
#include "kernels/convert.h"
#include "moe/ops/core.h"
#include "support/cuda.h"
#include "support/gradcheck.h"

using namespace moe;
namespace body = moe::cuda::body;

namespace {

std::vector<float> random_values(int64_t n, uint64_t seed) {
  return test::random_tensor({n}, seed).to_vector();
}

}  // namespace

TEST_CASE("cuda harness: convert, fill and round match the CPU conversions", "[cuda-harness]") {
  const int64_t n = 1001;
  std::vector<float> x = random_values(n, 1);
  x[0] = 65504.0f * 4;  // overflows f16
  x[1] = 1e-8f;         // f16 subnormal range
  for (auto shape : test::kHarnessGrids) {
    std::vector<uint16_t> bf(n), hf(n);
    cuda::run_grid_on_cpu<body::Convert>(shape, static_cast<const void*>(x.data()), 0,
                                         static_cast<void*>(bf.data()), 1, n);
    cuda::run_grid_on_cpu<body::Convert>(shape, static_cast<const void*>(x.data()), 0,
                                         static_cast<void*>(hf.data()), 2, n);
    Tensor xt = Tensor::from_vector({n}, x);
    Tensor ref_bf = xt.to(DType::bf16), ref_hf = xt.to(DType::f16);
    REQUIRE(std::memcmp(bf.data(), ref_bf.half_bits(), n * 2) == 0);
    REQUIRE(std::memcmp(hf.data(), ref_hf.half_bits(), n * 2) == 0);
    std::vector<float> back(n);
    cuda::run_grid_on_cpu<body::Convert>(shape, static_cast<const void*>(bf.data()), 1,
                                         static_cast<void*>(back.data()), 0, n);
    REQUIRE(back == ref_bf.to_vector());

    std::vector<float> r = x;
    cuda::run_grid_on_cpu<body::RoundTo>(shape, r.data(), 2, n);
    Tensor rt = Tensor::from_vector({n}, x);
    ops::round_to_dtype(rt, DType::f16);
    REQUIRE(r == rt.to_vector());

    std::vector<uint32_t> words(n, 0);
    cuda::run_grid_on_cpu<body::Fill32>(shape, words.data(), kernels::f32_bits(2.5f), n);
    for (uint32_t w : words) REQUIRE(kernels::bits_f32(w) == 2.5f);
  }
}

TEST_CASE("cuda harness: axpy and sum of squares match the CPU ops", "[cuda-harness]") {
  const int64_t n = 777;
  std::vector<float> x = random_values(n, 2), y = random_values(n, 3);
  Tensor xt = Tensor::from_vector({n}, x), yt = Tensor::from_vector({n}, y);
  ops::axpy(0.5f, xt, yt);
  const double ref = ops::sum_squares(xt);
  for (auto shape : test::kHarnessGrids) {
    std::vector<float> yy = y;
    cuda::run_grid_on_cpu<body::Axpy>(shape, 0.5f, static_cast<const float*>(x.data()), yy.data(),
                                      n);
    REQUIRE(yy == yt.to_vector());
    std::vector<double> partial(shape.blocks * shape.threads, -1.0);
    cuda::run_grid_on_cpu<body::SumSquaresPartial>(shape, static_cast<const float*>(x.data()), n,
                                                   partial.data());
    double s = 0;
    for (double p : partial) {
      REQUIRE(p >= 0);  // every thread wrote its slot
      s += p;
    }
    REQUIRE(s == Approx(ref).epsilon(1e-12));
  }
}
