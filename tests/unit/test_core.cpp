#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "kernels/convert.h"
#include "moe/arena.h"
#include "moe/ops/core.h"
#include "moe/param.h"
#include "moe/rng.h"
#include "support/gradcheck.h"

using namespace moe;

TEST_CASE("bf16 and f16 conversions round to nearest even", "[core]") {
  using namespace moe::kernels;
  REQUIRE(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (1.0).
  REQUIRE(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)) == 1.0f);
  REQUIRE(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256);
  REQUIRE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  REQUIRE(f16_to_f32(f32_to_f16(65504.0f)) == 65504.0f);
  REQUIRE(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
  REQUIRE(f16_to_f32(f32_to_f16(5.9604644775390625e-8f)) ==
          5.9604644775390625e-8f);  // min subnormal
  REQUIRE(f16_to_f32(f32_to_f16(-0.333333f)) == Approx(-0.333333f).epsilon(1e-3));
  // Every f16 bit pattern that is finite round-trips exactly.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    REQUIRE(f32_to_f16(f) == h);
  }
}

TEST_CASE("philox rng is a pure function of key and counter", "[core]") {
  uint64_t key = rng_key(42, {1, 2});
  REQUIRE(rng_uniform(key, 7) == rng_uniform(key, 7));
  REQUIRE(rng_uniform(key, 7) != rng_uniform(key, 8));
  REQUIRE(rng_key(42, {1, 2}) != rng_key(42, {2, 1}));
  double mean = 0, var = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    float z = rng_normal(key, i);
    mean += z;
    var += z * z;
  }
  mean /= n;
  var = var / n - mean * mean;
  REQUIRE(std::fabs(mean) < 0.03);
  REQUIRE(std::fabs(var - 1.0) < 0.05);
}

TEST_CASE("parameter init does not depend on thread count", "[core]") {
  auto make = [](int threads) {
    omp_set_num_threads(threads);
    ParamSet ps(7);
    ps.add("a.weight", {64, 33}, Init::normal(0.02f));
    return ps.at("a.weight").value.to_vector();
  };
  auto one = make(1);
  auto two = make(2);
  REQUIRE(std::memcmp(one.data(), two.data(), one.size() * 4) == 0);
}

TEST_CASE("parameters added while initial values or gradients are skipped", "[core]") {
  ParamSet ps(7, DType::bf16), plain(7, DType::bf16);
  ps.skip_initial_values(true);
  ps.skip_gradients(true);
  Param& skipped = ps.add("a.weight", {16, 8}, Init::normal(0.02f));
  ps.skip_initial_values(false);
  ps.skip_gradients(false);
  Param& after = ps.add("b.weight", {16, 8}, Init::normal(0.02f));
  plain.add("a.weight", {16, 8}, Init::normal(0.02f));
  plain.add("b.weight", {16, 8}, Init::normal(0.02f));
  // Left for a loader to write (not read here: its bytes are unwritten): the value's storage,
  // no f32 compute copy yet, no gradient.
  REQUIRE(skipped.value.dtype() == DType::bf16);
  REQUIRE(skipped.value.shape() == Shape{16, 8});
  REQUIRE(!skipped.compute.defined());
  REQUIRE(!skipped.grad.defined());
  REQUIRE(after.grad.defined());
  REQUIRE(after.compute.dtype() == DType::f32);
  // Initial values are keyed by name: the next parameter's are a plain set's, bit for bit.
  const std::vector<float> a = after.value.to_vector(), b = plain.at("b.weight").value.to_vector();
  REQUIRE(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
  REQUIRE(plain.at("a.weight").value.to_vector() != std::vector<float>(16 * 8, 0.0f));
}

TEST_CASE("gemm matches a naive loop for all transposes", "[core]") {
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      int64_t m = 5, n = 7, k = 3;
      Tensor a = test::random_tensor(ta ? Shape{k, m} : Shape{m, k}, 1);
      Tensor b = test::random_tensor(tb ? Shape{n, k} : Shape{k, n}, 2);
      Tensor c = test::random_tensor({m, n}, 3);
      Tensor c0 = c.clone();
      ops::gemm(a, ta, b, tb, c, 0.5f, 2.0f);
      const float* A = a.data<float>();
      const float* B = b.data<float>();
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p)
            s += (ta ? A[p * m + i] : A[i * k + p]) * (tb ? B[j * k + p] : B[p * n + j]);
          REQUIRE(c.data<float>()[i * n + j] ==
                  Approx(0.5 * s + 2.0 * c0.data<float>()[i * n + j]).epsilon(1e-5));
        }
    }
  Tensor a = test::random_tensor({2, 3}, 1), b = test::random_tensor({4, 2}, 2),
         c = Tensor::zeros({2, 2});
  REQUIRE_THROWS_WITH(ops::gemm(a, false, b, false, c), Catch::Contains("do not chain"));
}

TEST_CASE("arena tensors reuse memory after reset", "[core]") {
  Arena arena(1 << 16);
  void* first;
  {
    ArenaScope scope(arena);
    first = Tensor::empty({100}).raw();
    Tensor::empty({200000});  // larger than a chunk
  }
  REQUIRE(arena.peak_bytes() >= 400 + 800000);
  arena.reset();
  {
    ArenaScope scope(arena);
    REQUIRE(Tensor::empty({100}).raw() == first);
  }
  REQUIRE(ArenaScope::current() == nullptr);
}

TEST_CASE("tensor views, conversions and shape errors name the tensor", "[core]") {
  Tensor t = test::random_tensor({4, 3}, 5).set_name("blocks.0.x");
  Tensor r = t.rows(1, 3);
  REQUIRE(r.shape() == Shape{2, 3});
  REQUIRE(r.data<float>()[0] == t.data<float>()[3]);
  Tensor h = t.to(DType::bf16);
  auto back = h.to_vector();
  for (int i = 0; i < 12; ++i) REQUIRE(back[i] == Approx(t.data<float>()[i]).epsilon(1e-2));
  REQUIRE_THROWS_WITH(t.expect_shape({3, 4}, "layer"), Catch::Contains("blocks.0.x[4,3]"));
  REQUIRE_THROWS_AS(t.data<int32_t>(), Error);
}

TEST_CASE("a tensor over caller-allocated storage shares it", "[core]") {
  auto storage = std::shared_ptr<std::byte>(new std::byte[6 * sizeof(float)],
                                            std::default_delete<std::byte[]>());
  Tensor t = Tensor::from_storage(storage, {2, 3}, DType::f32);
  REQUIRE(t.raw() == storage.get());
  REQUIRE(t.shape() == Shape{2, 3});
  REQUIRE(storage.use_count() == 2);
  Tensor row = t.rows(1, 2);
  row.copy_from(Tensor::from_vector({1, 3}, std::vector<float>{1.5f, -2.0f, 4.0f}));
  REQUIRE(reinterpret_cast<const float*>(storage.get())[4] == -2.0f);  // written through
  REQUIRE_THROWS_WITH(Tensor::from_storage(nullptr, {2}, DType::f32),
                      Catch::Contains("no storage"));
}

TEST_CASE("parameter shards hold the whole tensor's values", "[core]") {
  ParamSet whole(42), parts(42);
  const Param& w = whole.add("w", {4, 3, 5}, Init::normal(0.5f));
  const std::vector<float> all = w.value.to_vector();
  for (int dim = 0; dim < 3; ++dim) {
    const int64_t extent = w.value.dim(dim);
    for (int64_t start = 0; start < extent; ++start) {
      for (int64_t count = 0; start + count <= extent; ++count) {
        std::string name = "w";
        ParamSet set(42);
        const Param& p =
            set.add_shard(name, ParamShard{{4, 3, 5}, dim, start, count}, Init::normal(0.5f));
        Shape local{4, 3, 5};
        local[static_cast<size_t>(dim)] = count;
        REQUIRE(p.value.shape() == local);
        REQUIRE(p.logical_numel() == 60);
        std::vector<float> got = p.value.to_vector();
        size_t i = 0;
        for (int64_t a = 0; a < local[0]; ++a)
          for (int64_t b = 0; b < local[1]; ++b)
            for (int64_t c = 0; c < local[2]; ++c, ++i) {
              int64_t g[3] = {a, b, c};
              g[dim] += start;
              REQUIRE(got[i] == all[static_cast<size_t>((g[0] * 3 + g[1]) * 5 + g[2])]);
            }
      }
    }
  }
  REQUIRE_THROWS_WITH(parts.add_shard("x", ParamShard{{4, 3}, 1, 2, 2}, Init::zeros()),
                      Catch::Contains("does not fit [4,3]"));
  REQUIRE_THROWS_WITH(parts.add_shard("y", ParamShard{{4, 3}, 2, 0, 1}, Init::zeros()),
                      Catch::Contains("dimension 2"));
  REQUIRE_FALSE(w.shard.defined());
}

TEST_CASE("ParamSet::to the device the parameters are on leaves them as they are", "[core]") {
  // A loaded 16-bit model reads its matrices in place (compute = value, no f32 copy): moving it
  // to the CPU it is on must not make the f32 copies again, nor copy any value or gradient.
  ParamSet ps(7, DType::bf16);
  Param& matrix = ps.add("a.weight", {16, 8}, Init::normal(0.02f));
  Param& plain = ps.add("b.weight", {16, 8}, Init::normal(0.02f));
  matrix.compute = matrix.value;  // as infer::lean_for_inference leaves it
  const void* value = matrix.value.raw();
  const void* grad = plain.grad.raw();
  const void* compute = plain.compute.raw();
  REQUIRE(plain.compute.dtype() == DType::f32);
  ps.to(Device{});
  REQUIRE(matrix.compute.raw() == value);
  REQUIRE(matrix.value.raw() == value);
  REQUIRE(plain.grad.raw() == grad);
  REQUIRE(plain.compute.raw() == compute);
}
