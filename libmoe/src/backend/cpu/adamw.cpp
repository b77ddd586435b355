// CPU AdamW update: kernels::adamw_update (the per-element kernel CUDA shares) on every element,
// in short blocks the compiler vectorises, with the instruction set picked at run time (the
// library targets baseline x86-64, so wide vectors come from per-function target attributes).
// Low-precision storage is fused into the same pass: each block's updated master is rounded to
// the storage dtype (and upcast to the compute copy) while it is still in L1.
//
// Bitwise equality with the scalar kernel on every path rests on two build flags on this file
// (libmoe/CMakeLists.txt): -ffp-contract=off, since GCC otherwise fuses `b1 * m + (1 - b1) * g`
// into an FMA on targets that have one, and -fno-math-errno, so sqrtf becomes a vector sqrt
// (correctly rounded, like division) rather than a scalar call. test_adamw_kernel.cpp checks it.
#include "backend/cpu/adamw.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "backend/cpu/backend.h"
#include "core/parallel.h"
#include "kernels/convert.h"
#include "moe/error.h"

namespace moe::cpu {
namespace {

// Elements per block: the rounding pass of a block rereads its master from L1. Full blocks have
// a compile-time trip count (after inlining), so they vectorise without a scalar remainder.
constexpr int64_t kBlock = 128;
// Elements per OpenMP iteration: static scheduling hands each thread one contiguous range.
constexpr int64_t kSpan = 16384;

enum class Store { none, bf16, f16 };

// kernels::f32_to_f16 and f16_to_f32 without branches: the originals' early returns (and GCC's
// reluctance to if-convert their ternaries) keep those loops scalar. Same bits for every input
// (test_adamw_kernel.cpp sweeps the float range through both). Unselected lanes compute garbage
// with defined unsigned arithmetic: the subnormal shift is clamped to [1, 24] (its range there).
[[gnu::always_inline]] inline uint32_t bit_select(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

[[gnu::always_inline]] inline uint16_t to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  const uint32_t normal = (abs + 0xfffu + ((abs >> 13) & 1u) - 0x38000000u) >> 13;
  uint32_t shift = 126u - (abs >> 23);
  shift = bit_select(shift > 24u, 24u, shift);
  shift = bit_select(shift < 1u, 1u, shift);
  const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t result = mantissa >> shift;
  // Round to nearest even on the bits shifted out (written so that GCC 12 vectorises it).
  const uint32_t remainder = mantissa - (result << shift);
  const uint32_t half = 0x800000u >> (24u - shift);  // 2^(shift - 1)
  const uint32_t up =
      bit_select(remainder > half, 1u, 0u) | (bit_select(remainder == half, 1u, 0u) & result & 1u);
  uint32_t out = bit_select(abs < 0x38800000u, result + up, normal);  // below 2^-14: subnormal
  out = bit_select(abs < 0x33000000u, 0u, out);                       // below 2^-25: zero
  out = bit_select(abs >= 0x477ff000u, 0x7c00u, out);                 // overflow and infinity
  out = bit_select(abs > 0x7f800000u, 0x7e00u, out);                  // NaN
  return static_cast<uint16_t>(sign | out);
}

[[gnu::always_inline]] inline float from_f16(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  // mantissa * 2^-24 is exact; the sign bit on a non-negative value is its negation.
  const float sub = static_cast<float>(static_cast<int32_t>(mantissa)) * 5.9604644775390625e-8f;
  uint32_t bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  bits = bit_select(exponent == 0, sign | std::bit_cast<uint32_t>(sub), bits);
  bits = bit_select(exponent == 31, sign | 0x7f800000u | (mantissa << 13), bits);
  return std::bit_cast<float>(bits);
}

template <Store kStore>
[[gnu::always_inline]] inline void update_block(float* __restrict master, float* __restrict m,
                                                float* __restrict v, const float* __restrict g,
                                                uint16_t* __restrict value,
                                                float* __restrict compute, int64_t n,
                                                const kernels::AdamWScalars& scalars) {
  const kernels::AdamWScalars s = scalars;  // a local copy: stores to master cannot alias it
  for (int64_t i = 0; i < n; ++i) kernels::adamw_update(master[i], m[i], v[i], g[i], s);
  if constexpr (kStore == Store::bf16) {
    for (int64_t i = 0; i < n; ++i) value[i] = kernels::f32_to_bf16(master[i]);
    if (compute)
      for (int64_t i = 0; i < n; ++i) compute[i] = kernels::bf16_to_f32(value[i]);
  } else if constexpr (kStore == Store::f16) {
    for (int64_t i = 0; i < n; ++i) value[i] = to_f16(master[i]);
    if (compute)
      for (int64_t i = 0; i < n; ++i) compute[i] = from_f16(value[i]);
  }
}

template <Store kStore>
[[gnu::always_inline]] inline void update_range(const AdamWArrays& a, int64_t begin, int64_t end,
                                                const kernels::AdamWScalars& s) {
  // A head up to the next 64-byte boundary of master: the blocks' vector loads and stores then
  // stay within cache lines when the four arrays share their alignment (any allocator that aligns
  // large blocks alike); 512-bit accesses that split lines cost ~10% of a memory-bound step.
  const auto address = reinterpret_cast<uintptr_t>(a.master + begin);
  const int64_t head = std::min<int64_t>(
      end - begin, static_cast<int64_t>((64 - address % 64) % 64 / sizeof(float)));
  if (head > 0) {
    float* c = a.compute ? a.compute + begin : nullptr;
    uint16_t* value = a.value ? a.value + begin : nullptr;
    update_block<kStore>(a.master + begin, a.m + begin, a.v + begin, a.grad + begin, value, c, head,
                         s);
    begin += head;
  }
  for (int64_t b = begin; b < end; b += kBlock) {
    float* c = a.compute ? a.compute + b : nullptr;
    uint16_t* value = a.value ? a.value + b : nullptr;
    if (end - b >= kBlock)
      update_block<kStore>(a.master + b, a.m + b, a.v + b, a.grad + b, value, c, kBlock, s);
    else
      update_block<kStore>(a.master + b, a.m + b, a.v + b, a.grad + b, value, c, end - b, s);
  }
}

[[gnu::always_inline]] inline void update_any(const AdamWArrays& a, int64_t begin, int64_t end,
                                              const kernels::AdamWScalars& s) {
  if (!a.value)
    update_range<Store::none>(a, begin, end, s);
  else if (a.value_dtype == DType::bf16)
    update_range<Store::bf16>(a, begin, end, s);
  else
    update_range<Store::f16>(a, begin, end, s);
}

void range_baseline(const AdamWArrays& a, int64_t begin, int64_t end,
                    const kernels::AdamWScalars& s) {
  update_any(a, begin, end, s);
}
#if MOE_VECTOR_ISA_X86
MOE_TARGET_AVX2 void range_avx2(const AdamWArrays& a, int64_t begin, int64_t end,
                                const kernels::AdamWScalars& s) {
  update_any(a, begin, end, s);
}
MOE_TARGET_AVX512 void range_avx512(const AdamWArrays& a, int64_t begin, int64_t end,
                                    const kernels::AdamWScalars& s) {
  update_any(a, begin, end, s);
}
#endif

using RangeFn = void (*)(const AdamWArrays&, int64_t, int64_t, const kernels::AdamWScalars&);

RangeFn range_fn(VectorIsa isa) {
#if MOE_VECTOR_ISA_X86
  if (isa == VectorIsa::avx512) return range_avx512;
  if (isa == VectorIsa::avx2) return range_avx2;
#endif
  return range_baseline;
}

}  // namespace

void adamw_update_arrays(const AdamWArrays& a, int64_t n, const kernels::AdamWScalars& scalars,
                         VectorIsa isa) {
  MOE_CHECK(vector_isa_supported(isa), "cpu adamw: the ", vector_isa_name(isa),
            " path needs an instruction set this CPU lacks");
  MOE_CHECK(!a.compute || a.value, "cpu adamw: a compute copy needs the storage value");
  MOE_CHECK(!a.value || a.value_dtype == DType::bf16 || a.value_dtype == DType::f16,
            "cpu adamw: fused storage must be bf16 or f16, not ", dtype_name(a.value_dtype));
  const RangeFn fn = range_fn(isa);
  const int64_t spans = (n + kSpan - 1) / kSpan;
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
  for (int64_t s = 0; s < spans; ++s) fn(a, s * kSpan, std::min(n, (s + 1) * kSpan), scalars);
}

void adamw_update(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                  const kernels::AdamWScalars& sc) {
  AdamWArrays a{master.data<float>(), m.data<float>(), v.data<float>(), grad.data<float>()};
  adamw_update_arrays(a, master.numel(), sc, vector_isa_best());
}

void adamw_update_rounded(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad,
                          const kernels::AdamWScalars& sc, Tensor& value, Tensor* compute) {
  AdamWArrays a{master.data<float>(), m.data<float>(), v.data<float>(), grad.data<float>()};
  a.value = value.half_bits();
  a.value_dtype = value.dtype();
  a.compute = compute ? compute->data<float>() : nullptr;
  adamw_update_arrays(a, master.numel(), sc, vector_isa_best());
}

}  // namespace moe::cpu
