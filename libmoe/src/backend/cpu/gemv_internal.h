// Pieces the decode GEMV's files share (gemv.cpp: f32/bf16/f16 and Q8_0 widened to f32;
// gemv_q8.cpp: Q8_0 against 8-bit input rows). Not part of the library's interface.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/gemv.h"
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

// The fixed reduction of the 16 lanes (halves: 8, 4, 2, 1), shared by every path.
inline float reduce_lanes(float* lane) {
  for (int64_t half = kLanes / 2; half >= 1; half /= 2)
    for (int64_t l = 0; l < half; ++l) lane[l] += lane[l + half];
  return lane[0];
}

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);  // a row's scales may sit at an odd address
  return kernels::f16_to_f32(h);
}

// One value of a Q8_0 block: x / scale rounded to nearest even and clamped to [-127, 127], 0
// for a zero scale. The one rule of both quantisers: stored weights (quantize_q8_0_row, scale
// the stored f16 one) and decode's inputs (quantize_q8_input_row, scale in f32).
inline int8_t q8_quantize(float x, float scale) {
  const float v = scale > 0 ? std::nearbyint(x / scale) : 0.0f;
  return static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
}

inline const uint8_t* q8_row(const WeightMatrix& w, int64_t o) {
  return static_cast<const uint8_t*>(w.data) + o * q8_row_bytes(w.in);
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
