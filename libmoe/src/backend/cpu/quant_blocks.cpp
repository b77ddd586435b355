// The block formats of quant_blocks.h. The quantisers follow llama.cpp's reference quantisers
// operation for operation, in f32 and in the same order, because their output is compared byte
// for byte with llama.cpp's: the K-quants search candidate scales by weighted least squares, and
// a different summation order or a fused multiply-add changes which candidate wins. So this file
// must build without FMA contraction (the library's baseline x86-64 has no FMA; a -march that
// adds it needs -ffp-contract=off here).
#include "backend/cpu/quant_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/block_fields.h"
#include "kernels/convert.h"
#include "moe/error.h"

namespace moe::cpu {

namespace {

constexpr int kK = 256;  // a K-quant super-block (ggml's QK_K)
constexpr int kQ4KBytes = 144, kQ6KBytes = 210, kMxfp4Bytes = 17, kQ8KBytes = 292, kQ80Bytes = 34;
// Below this largest magnitude ggml takes a Q6_K sub-block (or block) as all zero.
constexpr float kGroupMaxEps = 1e-15f;
using block_fields::e8m0_half;
using block_fields::kE2M1x2;
using block_fields::load_f16;
using block_fields::load_f32;
using block_fields::load_u16;
using block_fields::store_u16;

// Round to nearest, ties to even, by adding 1.5 * 2^23 (exact for |v| < 2^22, ggml's
// nearest_int); outside that range, and for NaN, it gives the same (meaningless) bits as ggml.
int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

// An f16 scale that must be finite: the block's values are beyond what the format holds.
uint16_t f16_scale(BlockFormat format, float scale, int64_t block) {
  const uint16_t bits = kernels::f32_to_f16(scale);
  MOE_CHECK((bits & 0x7c00u) != 0x7c00u, block_format_name(format), ": block ", block,
            " needs an f16 scale of ", scale,
            ", beyond f16's range (65504): its values are too "
            "large for this format");
  return bits;
}

void check_finite(BlockFormat format, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    MOE_CHECK(std::isfinite(x[i]), block_format_name(format), ": value ", i, " of ", n,
              " is not finite (", x[i], ")");
}

// The 6-bit scale and min of Q4_K sub-block j from the 12 packed bytes.
void q4k_scale_min(int j, const uint8_t* packed, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = packed[j] & 63;
    *m = packed[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((packed[j + 4] & 15) | (packed[j - 4] >> 6) << 4);
    *m = static_cast<uint8_t>((packed[j + 4] >> 4) | (packed[j] >> 6) << 4);
  }
}

// ---- Q4_K --------------------------------------------------------------------------------------

// Weighted squared error of levels L against x with a given scale and (negative) min.
float q4k_error(const float* x, const float* w, const uint8_t* L, float scale, float min) {
  float error = 0;
  for (int i = 0; i < 32; ++i) {
    const float diff = scale * L[i] + min - x[i];
    error += w[i] * (diff * diff);
  }
  return error;
}

// ggml's make_qkx2_quants(32, 15, x, w, L, &min, Laux, -1, 0.1, 20, false): levels 0..15 for
// x ~ scale * L - min. Starts from the range's scale, then tries 21 slightly larger level counts,
// fitting scale and min by weighted least squares for each, and keeps the lowest weighted error.
float q4k_fit(const float* x, const float* w, uint8_t* L, float* neg_min) {
  float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < 32; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + 32, uint8_t{0});
    *neg_min = -min;
    return 0.0f;
  }
  float iscale = 15 / (max - min), scale = 1 / iscale;
  for (int i = 0; i < 32; ++i)
    L[i] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * (x[i] - min)), 0, 15));
  float best_error = q4k_error(x, w, L, scale, min);
  uint8_t trial[32];
  for (int step = 0; step <= 20; ++step) {
    iscale = (-1.0f + 0.1f * static_cast<float>(step) + 15) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < 32; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, 15);
      trial[i] = static_cast<uint8_t>(l);
      const float lf = static_cast<float>(l);
      sum_l += w[i] * lf;
      sum_l2 += w[i] * lf * lf;
      sum_xl += w[i] * lf * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (!(D > 0)) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    const float error = q4k_error(x, w, trial, this_scale, this_min);
    if (error < best_error) {
      std::copy(trial, trial + 32, L);
      best_error = error;
      scale = this_scale;
      min = this_min;
    }
  }
  *neg_min = -min;
  return scale;
}

void quantize_q4k_block(const float* x, uint8_t* out, int64_t block) {
  uint8_t L[kK];
  float scales[8], mins[8], max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    // Weights favour large magnitudes, offset by the sub-block's RMS (ggml's choice).
    float sum_x2 = 0, w[32];
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float rms = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) w[l] = rms + std::fabs(xs[l]);
    scales[j] = q4k_fit(xs, w, L + 32 * j, &mins[j]);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  // Scales and mins relative to the largest, in 6 bits (truncated to 8 bits first, as ggml).
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t* packed = out + 4;
  std::fill(packed, packed + 12, uint8_t{0});
  for (int j = 0; j < 8; ++j) {
    const auto ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    const auto lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
    if (j < 4) {
      packed[j] = ls;
      packed[j + 4] = lm;
    } else {
      packed[j + 4] = static_cast<uint8_t>((ls & 15) | (lm & 15) << 4);
      packed[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      packed[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  const uint16_t d16 = f16_scale(BlockFormat::q4_k, max_scale / 63.0f, block);
  const uint16_t dmin16 = f16_scale(BlockFormat::q4_k, max_min / 63.0f, block);
  store_u16(out, d16);
  store_u16(out + 2, dmin16);
  // Levels again against the stored (rounded) scales; a sub-block of scale 0 keeps its fit's.
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    q4k_scale_min(j, packed, &sc, &m);
    const float d = kernels::f16_to_f32(d16) * sc;
    if (d == 0) continue;
    const float dm = kernels::f16_to_f32(dmin16) * m;
    for (int l = 0; l < 32; ++l)
      L[32 * j + l] =
          static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + l] + dm) / d), 0, 15));
  }
  uint8_t* qs = out + 16;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | L[64 * c + 32 + l] << 4);
}

void dequantize_q4k_block(const uint8_t* in, float* y) {
  const float d = load_f16(in), dmin = load_f16(in + 2);
  const uint8_t* qs = in + 16;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    q4k_scale_min(j, in + 4, &sc, &m);
    const float step = d * sc, offset = dmin * m;
    const int shift = (j & 1) * 4;  // even sub-blocks in the low nibbles, odd in the high ones
    for (int l = 0; l < 32; ++l)
      y[32 * j + l] = step * static_cast<float>((qs[32 * (j / 2) + l] >> shift) & 15) - offset;
  }
}

// ---- Q6_K --------------------------------------------------------------------------------------

// The two sums of make_qx_quants for levels at `iscale`: sum w x l and sum w l^2, w = x^2.
void q6k_sums(const float* x, float iscale, float* sum_lx, float* sum_l2, int8_t* L) {
  *sum_lx = *sum_l2 = 0;
  for (int i = 0; i < 16; ++i) {
    const int l = std::clamp(nearest_int(iscale * x[i]), -32, 31);
    if (L) L[i] = static_cast<int8_t>(l + 32);
    const float w = x[i] * x[i], lf = static_cast<float>(l);
    *sum_lx += w * x[i] * lf;
    *sum_l2 += w * lf * lf;
  }
}

// ggml's make_qx_quants(16, 32, x, L, 1, NULL): a signed scale for levels -32..31 (stored +32)
// that maps the largest magnitude to -32; tries 18 nearby level counts and keeps the one of
// largest (sum w x l)^2 / sum w l^2, w = x^2, i.e. the least weighted squared error.
float q6k_fit(const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < 16; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + 16, int8_t{0});
    return 0.0f;
  }
  float sum_lx, sum_l2;
  q6k_sums(x, -32 / max, &sum_lx, &sum_l2, L);
  float scale = sum_l2 != 0 ? sum_lx / sum_l2 : 0.0f;
  float best = scale * sum_lx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    const float iscale = -(32 + 0.1f * static_cast<float>(is)) / max;
    q6k_sums(x, iscale, &sum_lx, &sum_l2, nullptr);
    if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
      q6k_sums(x, iscale, &sum_lx, &sum_l2, L);
      scale = sum_lx / sum_l2;
      best = scale * sum_lx;
    }
  }
  return scale;
}

void quantize_q6k_block(const float* x, uint8_t* out, int64_t block) {
  int8_t L[kK];
  float scales[16], max_scale = 0, max_abs_scale = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = q6k_fit(x + 16 * j, L + 16 * j);
    if (std::fabs(scales[j]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  }
  std::fill(out, out + kQ6KBytes, uint8_t{0});
  if (max_abs_scale < kGroupMaxEps) return;  // all zero bytes, d = 0
  // The sub-block scales in int8 against the largest, which maps to -128.
  const float iscale = -128.0f / max_scale;
  const uint16_t d16 = f16_scale(BlockFormat::q6_k, 1 / iscale, block);
  store_u16(out + 208, d16);
  auto* sc = reinterpret_cast<int8_t*>(out + 192);
  for (int j = 0; j < 16; ++j)
    sc[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[j])));
  for (int j = 0; j < 16; ++j) {
    const float d = kernels::f16_to_f32(d16) * sc[j];
    if (d == 0) continue;  // keeps the fit's levels, as ggml
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = static_cast<int8_t>(std::clamp(nearest_int(x[16 * j + i] / d), -32, 31) + 32);
  }
  for (int h = 0; h < 2; ++h) {
    uint8_t* ql = out + 64 * h;
    uint8_t* qh = out + 128 + 32 * h;
    const int8_t* q = L + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[l] = static_cast<uint8_t>((q[l] & 15) | (q[l + 64] & 15) << 4);
      ql[l + 32] = static_cast<uint8_t>((q[l + 32] & 15) | (q[l + 96] & 15) << 4);
      qh[l] = static_cast<uint8_t>(q[l] >> 4 | (q[l + 32] >> 4) << 2 | (q[l + 64] >> 4) << 4 |
                                   (q[l + 96] >> 4) << 6);
    }
  }
}

// The 6-bit level (0..63) of value i (< 256) of a Q6_K block.
int q6k_level(const uint8_t* in, int i) {
  const int h = i / 128, k = (i % 128) / 32, l = i % 32;
  const uint8_t low = in[64 * h + 32 * (k & 1) + l];
  const uint8_t high = in[128 + 32 * h + l];
  return (k < 2 ? low & 15 : low >> 4) | ((high >> (2 * k)) & 3) << 4;
}

void dequantize_q6k_block(const uint8_t* in, float* y) {
  const float d = load_f16(in + 208);
  const auto* sc = reinterpret_cast<const int8_t*>(in + 192);
  for (int i = 0; i < kK; ++i) y[i] = d * sc[i / 16] * static_cast<float>(q6k_level(in, i) - 32);
}

// ---- MXFP4, Q8_K, Q8_0 -------------------------------------------------------------------------

// The nibble of the E2M1 value nearest x / unit (the first in table order on ties, as ggml).
uint8_t mxfp4_nearest(float x, float unit) {
  int best = 0;
  float best_err = std::fabs(kE2M1x2[0] * unit - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(kE2M1x2[i] * unit - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

void quantize_mxfp4_block(const float* x, uint8_t* out) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  // The OCP scale: 2^(floor(log2 amax) - 2), 2 being E2M1's largest exponent. log2f as ggml (it
  // rounds up just below a power of two); below 2^-125 ggml's byte is undefined: we take 0.
  const float exponent = amax > 0 ? std::floor(std::log2(amax)) - 2 + 127 : 0.0f;
  const auto e = static_cast<uint8_t>(exponent < 0 ? 0.0f : exponent);
  out[0] = e;
  const float unit = e8m0_half(e);
  for (int j = 0; j < 16; ++j)
    out[1 + j] =
        static_cast<uint8_t>(mxfp4_nearest(x[j], unit) | mxfp4_nearest(x[j + 16], unit) << 4);
}

void dequantize_mxfp4_block(const uint8_t* in, float* y) {
  const float unit = e8m0_half(in[0]);
  for (int j = 0; j < 16; ++j) {
    y[j] = kE2M1x2[in[1 + j] & 15] * unit;
    y[j + 16] = kE2M1x2[in[1 + j] >> 4] * unit;
  }
}

void quantize_q8k_block(const float* x, uint8_t* out) {
  float max = 0, amax = 0;
  for (int i = 0; i < kK; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  std::fill(out, out + kQ8KBytes, uint8_t{0});
  if (amax == 0) return;
  // -127 / max: the largest magnitude maps to -127 (d is negative for a positive max, as ggml).
  const float iscale = -127.0f / max;
  auto* qs = reinterpret_cast<int8_t*>(out + 4);
  for (int i = 0; i < kK; ++i)
    qs[i] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[i])));
  for (int j = 0; j < 16; ++j) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += qs[16 * j + i];
    store_u16(out + 260 + 2 * j, static_cast<uint16_t>(sum));
  }
  const float d = 1 / iscale;
  std::memcpy(out, &d, sizeof d);
}

void dequantize_q8k_block(const uint8_t* in, float* y) {
  const float d = load_f32(in);
  for (int i = 0; i < kK; ++i) y[i] = d * static_cast<int8_t>(in[4 + i]);
}

void quantize_q80_block(const float* x, uint8_t* out, int64_t block) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  // Values are rounded (half away from zero) against the f32 scale, which is stored as f16.
  const float d = amax / 127, inverse = d != 0 ? 1 / d : 0.0f;
  store_u16(out, f16_scale(BlockFormat::q8_0, d, block));
  for (int i = 0; i < 32; ++i)
    out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[i] * inverse)));
}

void dequantize_q80_block(const uint8_t* in, float* y) {
  const float d = load_f16(in);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<int8_t>(in[2 + i]);
}

// ---- dot products ------------------------------------------------------------------------------

float dot_q4k_block(const uint8_t* w, const uint8_t* a) {
  const auto* q8 = reinterpret_cast<const int8_t*>(a + 4);
  int32_t levels = 0, mins = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    q4k_scale_min(j, w + 4, &sc, &m);
    const uint8_t* qs = w + 16 + 32 * (j / 2);
    const int shift = (j & 1) * 4;
    int32_t sum = 0;
    for (int l = 0; l < 32; ++l) sum += ((qs[l] >> shift) & 15) * q8[32 * j + l];
    levels += sc * sum;
    mins += m * (static_cast<int16_t>(load_u16(a + 260 + 4 * j)) +
                 static_cast<int16_t>(load_u16(a + 262 + 4 * j)));
  }
  const float d8 = load_f32(a);
  return (load_f16(w) * d8) * static_cast<float>(levels) -
         (load_f16(w + 2) * d8) * static_cast<float>(mins);
}

float dot_q6k_block(const uint8_t* w, const uint8_t* a) {
  const auto* q8 = reinterpret_cast<const int8_t*>(a + 4);
  const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
  int32_t levels = 0;
  for (int j = 0; j < 16; ++j) {
    int32_t sum = 0;
    for (int i = 16 * j; i < 16 * j + 16; ++i) sum += (q6k_level(w, i) - 32) * q8[i];
    levels += sc[j] * sum;
  }
  return (load_f16(w + 208) * load_f32(a)) * static_cast<float>(levels);
}

float dot_mxfp4_block(const uint8_t* w, const uint8_t* a) {
  const auto* q8 = reinterpret_cast<const int8_t*>(a + 2);
  int32_t sum = 0;
  for (int j = 0; j < 16; ++j)
    sum += kE2M1x2[w[1 + j] & 15] * q8[j] + kE2M1x2[w[1 + j] >> 4] * q8[j + 16];
  return (load_f16(a) * e8m0_half(w[0])) * static_cast<float>(sum);
}

}  // namespace

const char* block_format_name(BlockFormat format) {
  switch (format) {
    case BlockFormat::q4_k:
      return "q4_k";
    case BlockFormat::q6_k:
      return "q6_k";
    case BlockFormat::mxfp4:
      return "mxfp4";
    case BlockFormat::q8_k:
      return "q8_k";
    case BlockFormat::q8_0:
      return "q8_0";
  }
  return "?";
}

BlockFormat parse_block_format(const std::string& name) {
  for (BlockFormat f : {BlockFormat::q4_k, BlockFormat::q6_k, BlockFormat::mxfp4, BlockFormat::q8_k,
                        BlockFormat::q8_0})
    if (name == block_format_name(f)) return f;
  throw Error(str("'", name, "' is not a block format (q4_k, q6_k, mxfp4, q8_k, q8_0)"));
}

int64_t block_elems(BlockFormat format) {
  return format == BlockFormat::mxfp4 || format == BlockFormat::q8_0 ? 32 : kK;
}

int64_t block_bytes(BlockFormat format) {
  switch (format) {
    case BlockFormat::q4_k:
      return kQ4KBytes;
    case BlockFormat::q6_k:
      return kQ6KBytes;
    case BlockFormat::mxfp4:
      return kMxfp4Bytes;
    case BlockFormat::q8_k:
      return kQ8KBytes;
    case BlockFormat::q8_0:
      return kQ80Bytes;
  }
  return 0;
}

int64_t block_row_bytes(BlockFormat format, int64_t n) {
  MOE_CHECK(n >= 0 && n % block_elems(format) == 0, block_format_name(format), ": a row of ", n,
            " values is not a whole number of blocks of ", block_elems(format));
  return n / block_elems(format) * block_bytes(format);
}

void quantize_row(BlockFormat format, const float* x, int64_t n, uint8_t* out) {
  const int64_t blocks = block_row_bytes(format, n) / block_bytes(format);
  check_finite(format, x, n);
  const int64_t B = block_elems(format), bytes = block_bytes(format);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * B;
    uint8_t* ob = out + b * bytes;
    switch (format) {
      case BlockFormat::q4_k:
        quantize_q4k_block(xb, ob, b);
        break;
      case BlockFormat::q6_k:
        quantize_q6k_block(xb, ob, b);
        break;
      case BlockFormat::mxfp4:
        quantize_mxfp4_block(xb, ob);
        break;
      case BlockFormat::q8_k:
        quantize_q8k_block(xb, ob);
        break;
      case BlockFormat::q8_0:
        quantize_q80_block(xb, ob, b);
        break;
    }
  }
}

void dequantize_row(BlockFormat format, const uint8_t* row, int64_t n, float* out) {
  const int64_t blocks = block_row_bytes(format, n) / block_bytes(format);
  const int64_t B = block_elems(format), bytes = block_bytes(format);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* in = row + b * bytes;
    float* y = out + b * B;
    switch (format) {
      case BlockFormat::q4_k:
        dequantize_q4k_block(in, y);
        break;
      case BlockFormat::q6_k:
        dequantize_q6k_block(in, y);
        break;
      case BlockFormat::mxfp4:
        dequantize_mxfp4_block(in, y);
        break;
      case BlockFormat::q8_k:
        dequantize_q8k_block(in, y);
        break;
      case BlockFormat::q8_0:
        dequantize_q80_block(in, y);
        break;
    }
  }
}

BlockFormat dot_partner(BlockFormat weights) {
  switch (weights) {
    case BlockFormat::q4_k:
    case BlockFormat::q6_k:
      return BlockFormat::q8_k;
    case BlockFormat::mxfp4:
      return BlockFormat::q8_0;
    default:
      break;
  }
  throw Error(str("dot_row: ", block_format_name(weights),
                  " is an activation format, not a weight format"));
}

float dot_row(BlockFormat weights, const uint8_t* wrow, const uint8_t* arow, int64_t n) {
  const BlockFormat act = dot_partner(weights);
  const int64_t blocks = block_row_bytes(weights, n) / block_bytes(weights);
  const int64_t wbytes = block_bytes(weights), abytes = block_bytes(act);
  float sum = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* w = wrow + b * wbytes;
    const uint8_t* a = arow + b * abytes;
    switch (weights) {
      case BlockFormat::q4_k:
        sum += dot_q4k_block(w, a);
        break;
      case BlockFormat::q6_k:
        sum += dot_q6k_block(w, a);
        break;
      default:
        sum += dot_mxfp4_block(w, a);
        break;
    }
  }
  return sum;
}

float block_scale(BlockFormat format, const uint8_t* block, float* second) {
  *second = 0;
  switch (format) {
    case BlockFormat::q4_k:
      *second = load_f16(block + 2);
      return load_f16(block);
    case BlockFormat::q6_k:
      return load_f16(block + 208);
    case BlockFormat::mxfp4:  // E8M0's 0xFF is NaN
      return block[0] == 0xFF ? std::nanf("") : std::ldexp(1.0f, int(block[0]) - 127);
    case BlockFormat::q8_k:
      return load_f32(block);
    case BlockFormat::q8_0:
      return load_f16(block);
  }
  return 0;
}

}  // namespace moe::cpu
