// Non-finite parameter detection in every floating dtype (NaN, +Inf, -Inf), and the message.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "moe/io/finite.h"
#include "support/gradcheck.h"
#include "support/run.h"

using namespace moe;

TEST_CASE("io: non-finite values are found in f32, bf16 and f16 tensors", "[io][validation]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    INFO(dtype_name(dtype));
    const Tensor clean = test::random_tensor({3, 5}, 7).to(dtype);
    REQUIRE(io::first_non_finite(clean) == -1);
    for (auto [value, name] :
         {std::pair{nan, "NaN"}, std::pair{inf, "inf"}, std::pair{-inf, "-inf"}}) {
      Tensor f = test::random_tensor({3, 5}, 7);
      f.data<float>()[11] = value;
      const Tensor t = f.to(dtype);
      REQUIRE(io::first_non_finite(t) == 11);
      REQUIRE(io::non_finite_name(t, 11) == name);
      const std::string msg = test::error_of([&] { io::check_finite("'m.h5'", "w1", t); });
      REQUIRE(msg == std::string("'m.h5': tensor 'w1' holds a non-finite value (") + name +
                         " at element 11 of [3,5])");
    }
  }
  // The largest finite values are finite; integer tensors never hold a non-finite value.
  Tensor big = test::random_tensor({4}, 3);
  big.data<float>()[2] = std::numeric_limits<float>::max();
  REQUIRE(io::first_non_finite(big) == -1);
  REQUIRE(io::first_non_finite(test::random_ids({6}, 1, 100)) == -1);
  REQUIRE(io::first_non_finite(Tensor::empty({0, 3})) == -1);
}

TEST_CASE("io: the first non-finite value is found across the scan's blocks", "[io][validation]") {
  // The scan tests blocks of 2048 elements at a time, then searches a block with a hit: the
  // first index must come back wherever it falls (a block's first and last element, the tail
  // after the last whole block, two hits in one block, a later block's hit not taken first).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t n = 3 * 2048 + 5;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    INFO(dtype_name(dtype));
    for (std::vector<int64_t> at :
         {std::vector<int64_t>{0}, {2047}, {2048}, {4095, 4100}, {n - 1}, {2050, 2049, 6000}}) {
      Tensor f = test::random_tensor({n}, 11);
      for (size_t i = 0; i < at.size(); ++i) f.data<float>()[at[i]] = i % 2 ? -inf : nan;
      INFO("first planted at " << at.front());
      REQUIRE(io::first_non_finite(f.to(dtype)) == *std::min_element(at.begin(), at.end()));
    }
    REQUIRE(io::first_non_finite(test::random_tensor({n}, 11).to(dtype)) == -1);
  }
}

// Issue 45: weights that exploded while finite (--lr 1e30 wrote 3e28). The bound is 2^32 in
// magnitude, either sign, in f32 and bf16 (same exponent); f16 cannot hold it, so only its NaN
// and Inf count. NaN and Inf count everywhere, and check_not_exploded gives their message then.
TEST_CASE("io: exploded weights are found at 2^32 and beyond, NaN and Inf too",
          "[io][validation]") {
  const float bound = 4294967296.0f;  // 2^32
  const float below = std::nextafter(bound, 0.0f);
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dtype));
    for (float value : {bound, -bound, 3e28f, -1e38f, std::numeric_limits<float>::quiet_NaN()}) {
      INFO(value);
      Tensor f = test::random_tensor({4, 600}, 5);
      f.data<float>()[2100] = value;
      f.data<float>()[2300] = value;
      const Tensor t = f.to(dtype);
      REQUIRE(io::first_exploded(t) == 2100);
      REQUIRE(io::first_non_finite(t) == (std::isnan(value) ? 2100 : -1));
    }
    Tensor f = test::random_tensor({4, 600}, 5);
    f.data<float>()[7] = dtype == DType::f32 ? below : -2147483648.0f;  // bf16 rounds 2^32 - 1 up
    REQUIRE(io::first_exploded(f.to(dtype)) == -1);
    f.data<float>()[9] = 3e28f;
    const std::string msg =
        test::error_of([&] { io::check_not_exploded("step 1", "w1", f.to(dtype)); });
    REQUIRE_THAT(msg, Catch::StartsWith("step 1: tensor 'w1' holds ") &&
                          Catch::Contains("e+28 at element 9 of [4,600]: a weight of 2^32 or "
                                          "more has exploded"));
    f.data<float>()[8] = -std::numeric_limits<float>::infinity();
    REQUIRE(test::error_of([&] { io::check_not_exploded("step 1", "w1", f.to(dtype)); }) ==
            "step 1: tensor 'w1' holds a non-finite value (-inf at element 8 of [4,600])");
  }
  Tensor f = test::random_tensor({8}, 2);
  f.data<float>()[3] = 65504.0f;  // f16's largest: no weight of f16 can explode
  REQUIRE(io::first_exploded(f.to(DType::f16)) == -1);
  f.data<float>()[5] = std::numeric_limits<float>::infinity();
  REQUIRE(io::first_exploded(f.to(DType::f16)) == 5);
  REQUIRE(io::first_exploded(test::random_ids({6}, 1, 100)) == -1);
}
