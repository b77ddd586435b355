// The fields of llama.cpp's blocks (backend/cpu/quant_blocks.h has the layouts), read and written
// one way for the codec (quant_blocks.cpp), the decode GEMV (gemv_blocks.cpp) and the scale checks
// of loaded weights (block_scale): little-endian fields, E2M1 levels, the E8M0 scale. Private.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/convert.h"

namespace moe::cpu::block_fields {

// E2M1 values, doubled so that they are integers (as ggml's kvalues_mxfp4): 2 x {0 .. 6}.
inline constexpr int8_t kE2M1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

inline uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
inline int32_t load_i16(const uint8_t* p) { return static_cast<int16_t>(load_u16(p)); }
inline void store_u16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline float load_f16(const uint8_t* p) { return kernels::f16_to_f32(load_u16(p)); }
inline float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof v);  // little-endian hosts only, as the rest of the library
  return v;
}
// 2^(e - 128): half the E8M0 scale, since kE2M1x2 holds doubled values (as ggml forms it; e 0 and
// 1 are subnormal).
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

}  // namespace moe::cpu::block_fields
