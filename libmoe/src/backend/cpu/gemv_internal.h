// Pieces the decode GEMV's files share (gemv.cpp: f32/bf16/f16 and Q8_0 widened to f32;
// gemv_q8.cpp: Q8_0 against 8-bit input rows). Not part of the library's interface.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/gemv.h"
#include "kernels/common.h"
#include "kernels/convert.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MOE_GEMV_X86 1
#include <immintrin.h>
#define MOE_TARGET_GEMV512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#endif

namespace moe::cpu::gemv_detail {

inline constexpr int64_t kLanes = 16;
// Output rows per parallel task: small enough that a 512-row matrix still feeds 2+ threads,
// large enough that the fork's cost is spread over some 100 KB of weights.
inline constexpr int64_t kRowsPerTask = 16;
static_assert(kRowsPerTask % kQ8Group == 0, "a task's rows start a Q8_0 row group (gemv.h)");

// The fixed reduction of the 16 lanes (halves: 8, 4, 2, 1), shared by every path.
using kernels::reduce_lanes;
static_assert(kLanes == kernels::kReduceLanes, "the GEMV's lanes are the tree's");

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);  // a row's scales may sit at an odd address
  return kernels::f16_to_f32(h);
}

// One value of a Q8_0 block: x / scale rounded to nearest even and clamped to [-127, 127], 0
// for a zero scale: the rule of stored weights (quantize_q8_0_row, scale the stored f16 one).
// Decode's inputs round x times an f32 multiplier instead, as ggml does (quantize_q8_input_row).
inline int8_t q8_quantize(float x, float scale) {
  const float v = scale > 0 ? std::nearbyint(x / scale) : 0.0f;
  return static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
}

// Q8_0 row groups (gemv.h): the byte offsets, from a matrix's start, of row o's pair t (its 64
// values) and of that pair's two block scales (f16, maybe at an odd address).
struct Q8PairOffsets {
  int64_t values, scales;
};
// The bytes from a row's pair to its next: its group's pair (g rows of 68 bytes).
inline int64_t q8_pair_stride(int64_t out, int64_t o) {
  return std::min(kQ8Group, out - (o - o % kQ8Group)) * kQ8PairBytes;
}
inline Q8PairOffsets q8_pair_offsets(int64_t out, int64_t in, int64_t o, int64_t t) {
  const int64_t first = o - o % kQ8Group, stride = q8_pair_stride(out, o);
  const int64_t pair = first * q8_group_row_bytes(in) + t * stride;
  return {pair + (o - first) * 2 * kQ8Block,
          pair + stride / kQ8PairBytes * 2 * kQ8Block + (o - first) * 4};
}
struct Q8Pair {
  const uint8_t* values;
  const uint8_t* scales;
};
inline Q8Pair q8_pair(const WeightMatrix& w, int64_t o, int64_t t) {
  const Q8PairOffsets at = q8_pair_offsets(w.out, w.in, o, t);
  const auto* base = static_cast<const uint8_t*>(w.data);
  return {base + at.values, base + at.scales};
}

// y = dot + beta y (beta 0: y is not read).
inline void store_output(const GemvProblem& p, int64_t i, int64_t o, float dot) {
  float& y = p.y[i * p.ldy + o];
  y = p.beta == 0.0f ? dot : dot + p.beta * y;
}

// Calls fn with the input row count m (1 .. kGemvMaxRows) as a compile-time constant
// (std::integral_constant<int, m>): the kernels unroll over the rows.
template <class Fn>
void with_rows(int64_t m, Fn&& fn) {
  static_assert(kGemvMaxRows == 8, "with_rows lists the row counts up to kGemvMaxRows");
  switch (m) {
    case 1:
      return fn(std::integral_constant<int, 1>{});
    case 2:
      return fn(std::integral_constant<int, 2>{});
    case 3:
      return fn(std::integral_constant<int, 3>{});
    case 4:
      return fn(std::integral_constant<int, 4>{});
    case 5:
      return fn(std::integral_constant<int, 5>{});
    case 6:
      return fn(std::integral_constant<int, 6>{});
    case 7:
      return fn(std::integral_constant<int, 7>{});
    default:
      return fn(std::integral_constant<int, 8>{});
  }
}

bool avx512_available();
bool avx512_vnni_available();

}  // namespace moe::cpu::gemv_detail
