// The vectorised CPU AdamW (backend/cpu/adamw.cpp) against the per-element kernel
// (kernels/adamw.h) called one element at a time: bitwise, on every instruction-set path this
// CPU runs, for sizes around the block and vector widths and above the parallel threshold, with
// and without weight decay, for f32 parameters and the fused bf16/f16 rounding. Then the
// optimizer-level guarantees built on it: AdamW::step equals the three-pass update it replaced,
// expert slices updated one by one equal the whole-tensor step, and two threads updating
// different tensors at once equal the same updates one after the other.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "backend/cpu/adamw.h"
#include "core/parallel.h"
#include "kernels/adamw.h"
#include "kernels/convert.h"
#include "moe/ops/optim.h"
#include "moe/optim/adamw.h"
#include "support/gradcheck.h"

using namespace moe;

namespace {

// State of one parameter: master, moments, gradient, and the storage/compute copies.
struct State {
  std::vector<float> master, m, v, grad, compute;
  std::vector<uint16_t> value;
};

// Magnitudes from 1e-9 to 1e2 and exact zeros, so that divisions and square roots round in many
// binades (a contracted multiply-add differs from the separate operations in about a third of
// random cases: a fused path cannot pass by chance).
State random_state(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-9, 2);
  auto draw = [&] { return normal(rng) * std::pow(10.0f, static_cast<float>(exponent(rng))); };
  State s;
  const size_t count = static_cast<size_t>(n);
  s.master.resize(count);
  s.m.resize(count);
  s.v.resize(count);
  s.grad.resize(count);
  for (size_t i = 0; i < count; ++i) {
    s.master[i] = draw();
    s.m[i] = draw();
    const float g = draw();
    s.v[i] = i % 13 == 0 ? 0.0f : g * g;
    s.grad[i] = i % 17 == 0 ? 0.0f : draw();
  }
  s.value.assign(count, 0);
  s.compute.assign(count, 0.0f);
  return s;
}

kernels::AdamWScalars scalars_for(int64_t step, bool decay) {
  optim::AdamWConfig c;
  c.beta2 = 0.999f;
  return optim::adamw_scalars(c, 3e-4f, step, decay);
}

// The reference: the per-element kernel, then the conversions Tensor::copy_from and
// Param::refresh_compute use.
void reference(State& s, const kernels::AdamWScalars& sc, DType storage) {
  for (size_t i = 0; i < s.master.size(); ++i) {
    kernels::adamw_update(s.master[i], s.m[i], s.v[i], s.grad[i], sc);
    if (storage == DType::bf16) {
      s.value[i] = kernels::f32_to_bf16(s.master[i]);
      s.compute[i] = kernels::bf16_to_f32(s.value[i]);
    } else if (storage == DType::f16) {
      s.value[i] = kernels::f32_to_f16(s.master[i]);
      s.compute[i] = kernels::f16_to_f32(s.value[i]);
    }
  }
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Index of the first element whose bits differ (for the failure message), -1 when none.
int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.raw());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

}  // namespace

TEST_CASE("adamw kernel: every ISA path is bitwise the per-element kernel", "[optim][adamw]") {
  const std::vector<cpu::VectorIsa> isas = cpu::vector_isas_supported();
  REQUIRE(isas.front() == cpu::VectorIsa::baseline);
  INFO("best path on this CPU: " << cpu::vector_isa_name(cpu::vector_isa_best()));
  const int64_t big = cpu::kParallelWork + 16384 + 19;  // parallel, several spans, odd tail
  for (int64_t n :
       {int64_t(0), int64_t(1), int64_t(7), int64_t(15), int64_t(16), int64_t(17), int64_t(31),
        int64_t(127), int64_t(128), int64_t(129), int64_t(1000), int64_t(4099), big}) {
    for (bool decay : {false, true}) {
      for (DType storage : {DType::f32, DType::bf16, DType::f16}) {
        for (cpu::VectorIsa isa : isas) {
          INFO("n " << n << ", decay " << decay << ", storage " << dtype_name(storage) << ", "
                    << cpu::vector_isa_name(isa));
          const uint64_t seed = static_cast<uint64_t>(n) * 31 + (decay ? 7 : 0);
          State want = random_state(n, seed), got = random_state(n, seed);
          // Two steps: the second reads moments the first wrote.
          for (int64_t step : {int64_t(1), int64_t(1000)}) {
            const kernels::AdamWScalars sc = scalars_for(step, decay);
            reference(want, sc, storage);
            cpu::AdamWArrays a{got.master.data(), got.m.data(), got.v.data(), got.grad.data()};
            if (storage != DType::f32) {
              a.value = got.value.data();
              a.value_dtype = storage;
              a.compute = got.compute.data();
            }
            cpu::adamw_update_arrays(a, n, sc, isa);
          }
          INFO("first differing master element " << first_difference(want.master, got.master));
          CHECK(same_bits(want.master, got.master));
          CHECK(same_bits(want.m, got.m));
          CHECK(same_bits(want.v, got.v));
          CHECK(same_bits(want.value, got.value));
          CHECK(same_bits(want.compute, got.compute));
        }
      }
    }
  }
}

TEST_CASE("adamw kernel: the fused rounding equals the conversions over the float range",
          "[optim][adamw]") {
  // With lr 0 and zero moments and gradient the update leaves every finite master as it is (inf
  // becomes NaN through 0 * inf, in the reference too), so the storage and compute copies see
  // these bit patterns: a stride through all 2^32, both signs, every pattern within 300 ulps of
  // the f16 thresholds (zero, subnormal, normal, overflow) and of bf16's largest finite values,
  // and every f16 value.
  std::vector<uint32_t> patterns;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 65521) patterns.push_back(uint32_t(u));
  for (uint32_t t : {0x00000000u, 0x00800000u, 0x33000000u, 0x38800000u, 0x477ff000u, 0x47800000u,
                     0x7f7f0000u, 0x7f800000u})
    for (int d = -300; d <= 300; ++d)
      for (uint32_t sign : {0u, 0x80000000u}) patterns.push_back(sign | (t + uint32_t(d)));
  for (uint32_t h = 0; h < 65536; ++h)  // every f16 value: its upcast is each one's compute copy
    patterns.push_back(kernels::f32_bits(kernels::f16_to_f32(static_cast<uint16_t>(h))));
  patterns.push_back(0x7fc00000u);  // quiet NaN
  patterns.push_back(0xff812345u);  // signalling NaN with a payload
  const int64_t n = static_cast<int64_t>(patterns.size());
  kernels::AdamWScalars sc = scalars_for(1, false);
  sc.lr = 0.0f;
  for (DType storage : {DType::bf16, DType::f16}) {
    for (cpu::VectorIsa isa : cpu::vector_isas_supported()) {
      INFO("storage " << dtype_name(storage) << ", " << cpu::vector_isa_name(isa));
      State want, got;
      for (State* s : {&want, &got}) {
        s->master.resize(patterns.size());
        std::memcpy(s->master.data(), patterns.data(), patterns.size() * 4);
        s->m.assign(patterns.size(), 0.0f);
        s->v.assign(patterns.size(), 0.0f);
        s->grad.assign(patterns.size(), 0.0f);
        s->value.assign(patterns.size(), 0);
        s->compute.assign(patterns.size(), 0.0f);
      }
      reference(want, sc, storage);
      cpu::AdamWArrays a{got.master.data(), got.m.data(), got.v.data(), got.grad.data()};
      a.value = got.value.data();
      a.value_dtype = storage;
      a.compute = got.compute.data();
      cpu::adamw_update_arrays(a, n, sc, isa);
      size_t bad = 0;
      while (bad < patterns.size() && got.value[bad] == want.value[bad]) ++bad;
      INFO("first differing storage value at pattern "
           << (bad < patterns.size() ? patterns[bad] : 0u));
      CHECK(same_bits(want.master, got.master));
      CHECK(same_bits(want.value, got.value));
      CHECK(same_bits(want.compute, got.compute));
    }
  }
}

TEST_CASE("adamw kernel: storage without a compute copy is written alone", "[optim][adamw]") {
  const int64_t n = 300;
  State want = random_state(n, 5), got = random_state(n, 5);
  const kernels::AdamWScalars sc = scalars_for(3, true);
  reference(want, sc, DType::bf16);
  cpu::AdamWArrays a{got.master.data(), got.m.data(), got.v.data(), got.grad.data()};
  a.value = got.value.data();
  cpu::adamw_update_arrays(a, n, sc, cpu::vector_isa_best());
  CHECK(same_bits(want.master, got.master));
  CHECK(same_bits(want.value, got.value));
  CHECK(got.compute == std::vector<float>(static_cast<size_t>(n), 0.0f));  // untouched
  // A compute copy without the storage it is made from is refused.
  cpu::AdamWArrays bad{got.master.data(), got.m.data(), got.v.data(), got.grad.data()};
  bad.compute = got.compute.data();
  REQUIRE_THROWS_WITH(cpu::adamw_update_arrays(bad, n, sc, cpu::VectorIsa::baseline),
                      Catch::Contains("compute copy needs the storage value"));
}

TEST_CASE("adamw kernel: two threads on different tensors equal one after the other",
          "[optim][adamw]") {
  // Each call is above the parallel threshold, so each thread forks its own OpenMP team.
  const int64_t n = 3 * cpu::kParallelWork + 5;
  State seq_a = random_state(n, 11), seq_b = random_state(n, 12);
  State par_a = seq_a, par_b = seq_b;
  auto run = [n](State& s, DType storage, int steps) {
    for (int step = 1; step <= steps; ++step) {
      cpu::AdamWArrays a{s.master.data(), s.m.data(), s.v.data(), s.grad.data()};
      if (storage != DType::f32) {
        a.value = s.value.data();
        a.value_dtype = storage;
        a.compute = s.compute.data();
      }
      cpu::adamw_update_arrays(a, n, scalars_for(step, true), cpu::vector_isa_best());
    }
  };
  run(seq_a, DType::f32, 6);
  run(seq_b, DType::bf16, 6);
  std::thread ta([&] { run(par_a, DType::f32, 6); });
  std::thread tb([&] { run(par_b, DType::bf16, 6); });
  ta.join();
  tb.join();
  CHECK(same_bits(seq_a.master, par_a.master));
  CHECK(same_bits(seq_a.v, par_a.v));
  CHECK(same_bits(seq_b.master, par_b.master));
  CHECK(same_bits(seq_b.m, par_b.m));
  CHECK(same_bits(seq_b.value, par_b.value));
  CHECK(same_bits(seq_b.compute, par_b.compute));
  // The runs did something: six steps moved every master with a nonzero gradient or moment.
  State start = random_state(n, 12);
  CHECK(start.master[1] != seq_b.master[1]);
}

TEST_CASE("adamw: step equals the update, rounding and refresh it fuses", "[optim][adamw]") {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    INFO("dtype " << dtype_name(dtype));
    ParamSet ps(21, dtype);
    Param& w = ps.add("w", {3, 33, 70}, Init::normal(0.5f), /*decay=*/true);
    Param& b = ps.add("b", {70}, Init::normal(0.5f), /*decay=*/false);
    optim::AdamWConfig config;
    optim::AdamW opt(ps, config);
    // The reference: per-element kernel on copies, then Tensor::copy_from and refresh_compute,
    // as AdamW::step ran before the fusion.
    struct Ref {
      Param* p;
      Tensor master, m, v, value;
    };
    std::vector<Ref> refs;
    for (Param* p : {&w, &b})
      refs.push_back({p, p->value.to(DType::f32), Tensor::zeros(p->value.shape()),
                      Tensor::zeros(p->value.shape()), p->value.clone()});
    for (int step = 1; step <= 3; ++step) {
      for (Ref& r : refs) r.p->grad.copy_from(test::random_tensor(r.p->value.shape(), 100 + step));
      opt.step(1e-2f);
      for (Ref& r : refs) {
        const kernels::AdamWScalars sc = optim::adamw_scalars(config, 1e-2f, step, r.p->decay);
        float* master = r.master.data<float>();
        for (int64_t i = 0; i < r.master.numel(); ++i)
          kernels::adamw_update(master[i], r.m.data<float>()[i], r.v.data<float>()[i],
                                r.p->grad.data<float>()[i], sc);
        r.value.copy_from(r.master);
      }
    }
    for (Ref& r : refs) {
      INFO(r.p->name);
      const optim::AdamW::ParamState st = opt.state_of(*r.p);
      CHECK(bytes_of(st.master) == bytes_of(r.master));
      CHECK(bytes_of(st.m) == bytes_of(r.m));
      CHECK(bytes_of(st.v) == bytes_of(r.v));
      CHECK(bytes_of(r.p->value) == bytes_of(r.value));
      CHECK(bytes_of(r.p->compute) == bytes_of(r.value.to(DType::f32)));
      CHECK(r.p->compute.name() == r.p->name);
    }
  }
}

TEST_CASE("adamw: expert slices updated one by one equal the whole-tensor step", "[optim][adamw]") {
  const int64_t E = 5, F = 12, D = 37;  // odd sizes: slices start off vector boundaries
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    INFO("dtype " << dtype_name(dtype));
    ParamSet whole_ps(8, dtype), sliced_ps(8, dtype);
    for (ParamSet* ps : {&whole_ps, &sliced_ps}) {
      ps->add("router", {E, D}, Init::normal(0.3f), true);
      ps->add("experts.w1", {E, F, D}, Init::normal(0.3f), true, /*expert=*/true);
      ps->add("experts.b1", {E, F}, Init::normal(0.3f), false, /*expert=*/true);
    }
    optim::AdamWConfig config;
    config.weight_decay = 0.05f;
    optim::AdamW whole(whole_ps, config), sliced(sliced_ps, config);
    const optim::AdamW::Filter dense = [](const Param& p) { return !p.expert; };
    for (int step = 1; step <= 3; ++step) {
      for (ParamSet* ps : {&whole_ps, &sliced_ps})
        for (Param* p : ps->all()) p->grad.copy_from(test::random_tensor(p->value.shape(), step));
      const float lr = 1e-2f / static_cast<float>(step);
      whole.step(lr);
      sliced.step(lr, dense);  // advances the counter, updates the router only
      REQUIRE(sliced.steps_taken() == step);
      for (Param* p : sliced_ps.all()) {
        if (!p->expert) continue;
        const kernels::AdamWScalars sc = sliced.scalars(lr, sliced.steps_taken(), p->decay);
        optim::AdamW::ParamState st = sliced.state_of(*p);
        // Experts in reverse order, as backward finishes them.
        for (int64_t e = E - 1; e >= 0; --e) {
          Tensor master = st.master.rows(e, e + 1), m = st.m.rows(e, e + 1),
                 v = st.v.rows(e, e + 1), grad = p->grad.rows(e, e + 1);
          if (dtype == DType::f32) {
            optim::adamw_update(master, m, v, grad, sc);
          } else {
            Tensor value = p->value.rows(e, e + 1), compute = p->compute.rows(e, e + 1);
            optim::adamw_update(master, m, v, grad, sc, &value, &compute);
          }
        }
      }
    }
    for (const Param* p : std::as_const(whole_ps).all()) {
      INFO(p->name);
      const Param& q = *sliced_ps.find(p->name);
      CHECK(bytes_of(p->value) == bytes_of(q.value));
      CHECK(bytes_of(p->compute) == bytes_of(q.compute));
      const optim::AdamW::ParamState a = whole.state_of(*p), b = sliced.state_of(q);
      CHECK(bytes_of(a.master) == bytes_of(b.master));
      CHECK(bytes_of(a.m) == bytes_of(b.m));
      CHECK(bytes_of(a.v) == bytes_of(b.v));
    }
    // The updates moved the expert values away from the initial ones.
    ParamSet fresh(8, dtype);
    fresh.add("router", {E, D}, Init::normal(0.3f), true);
    Param& w1 = fresh.add("experts.w1", {E, F, D}, Init::normal(0.3f), true, true);
    CHECK(bytes_of(w1.value) != bytes_of(sliced_ps.at("experts.w1").value));
  }
}

TEST_CASE("adamw: mismatched operands are refused with their descriptions", "[optim][adamw]") {
  Tensor master = Tensor::zeros({4}), m = Tensor::zeros({4}), v = Tensor::zeros({4});
  Tensor grad = Tensor::zeros({5});
  const kernels::AdamWScalars sc = scalars_for(1, true);
  REQUIRE_THROWS_WITH(ops::adamw_update(master, m, v, grad, sc),
                      Catch::Contains("5 elements") && Catch::Contains("has 4"));
  Tensor g4 = Tensor::zeros({4});
  Tensor half_m = Tensor::zeros({4}, DType::bf16);
  REQUIRE_THROWS_WITH(ops::adamw_update(master, half_m, v, g4, sc), Catch::Contains("f32"));
  Tensor f32_value = Tensor::zeros({4});
  REQUIRE_THROWS_WITH(ops::adamw_update_rounded(master, m, v, g4, sc, f32_value, nullptr),
                      Catch::Contains("must be bf16 or f16"));
  Tensor short_value = Tensor::zeros({3}, DType::bf16);
  REQUIRE_THROWS_WITH(ops::adamw_update_rounded(master, m, v, g4, sc, short_value, nullptr),
                      Catch::Contains("does not match the master"));
  Tensor value = Tensor::zeros({4}, DType::f16), compute = Tensor::zeros({2});
  REQUIRE_THROWS_WITH(ops::adamw_update_rounded(master, m, v, g4, sc, value, &compute),
                      Catch::Contains("compute copy"));
  // An f32 parameter has no separate storage to round into.
  Tensor other = Tensor::zeros({4});
  REQUIRE_THROWS_WITH(optim::adamw_update(master, m, v, g4, sc, &other),
                      Catch::Contains("master is its storage"));
  ParamSet ps(1), elsewhere(1);
  ps.add("w", {4}, Init::zeros());
  Param& stranger = elsewhere.add("stranger", {4}, Init::zeros());
  optim::AdamW opt(ps, optim::AdamWConfig{});
  REQUIRE_THROWS_WITH(opt.state_of(stranger), Catch::Contains("'stranger' is not in this"));
}
