// Non-finite parameter checks (see moe/io/finite.h).
#include "moe/io/finite.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "kernels/convert.h"
#include "moe/error.h"

namespace moe::io {

namespace {

// bf16 and f16 keep the IEEE layout: an all-ones exponent is Inf (zero mantissa) or NaN.
constexpr uint16_t kBf16Exponent = 0x7f80, kBf16Mantissa = 0x007f;
constexpr uint16_t kF16Exponent = 0x7c00, kF16Mantissa = 0x03ff;
constexpr uint32_t kF32Exponent = 0x7f800000u;

// The first index of bits[0, n) whose exponent field is all ones. A block at a time, the test of
// the block is branch-free (a count of the lanes' hits, which the compiler vectorises); only a
// block that holds a hit is searched element by element. The training step checks every
// parameter after each update, so this runs at memory speed rather than a compare and branch per
// element.
inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);  // compiles to a plain load
  return u;
}
inline uint16_t bits_of(uint16_t x) { return x; }

// The first index whose exponent field is at least `least` (all ones: NaN or Inf).
template <typename T, typename Bits>
int64_t first_exponent_at_least(const T* values, int64_t n, Bits exponent, Bits least) {
  constexpr int64_t kBlock = 2048;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    uint32_t hits = 0;  // a count, not a bool: GCC vectorises the sum and not the OR
    for (int64_t i = start; i < end; ++i) hits += (bits_of(values[i]) & exponent) >= least;
    if (hits == 0) continue;
    for (int64_t i = start; i < end; ++i)
      if ((bits_of(values[i]) & exponent) >= least) return i;
  }
  return -1;
}

// 2^32 as a biased exponent field: f32 and bf16 share the 8-bit exponent (bias 127). f16 cannot
// hold it (its largest value is 65504): there only NaN and Inf count.
constexpr uint32_t kF32Exploded = uint32_t(127 + 32) << 23;
constexpr uint16_t kBf16Exploded = uint16_t((127 + 32) << 7);

// With `exploded`, also magnitudes of at least 2^32.
int64_t first_beyond(const Tensor& t, bool exploded, const char* who) {
  if (!t.defined() || t.numel() == 0 || !is_floating(t.dtype())) return -1;
  MOE_CHECK(t.device().kind == Device::cpu, who, ": ", t.describe(), " is not on the CPU");
  const int64_t n = t.numel();
  if (t.dtype() == DType::f32)
    return first_exponent_at_least(t.data<float>(), n, kF32Exponent,
                                   exploded ? kF32Exploded : kF32Exponent);
  const bool bf16 = t.dtype() == DType::bf16;
  const uint16_t exponent = bf16 ? kBf16Exponent : kF16Exponent;
  return first_exponent_at_least(t.half_bits(), n, exponent,
                                 exploded && bf16 ? kBf16Exploded : exponent);
}

}  // namespace

int64_t first_non_finite(const Tensor& t) { return first_beyond(t, false, "first_non_finite"); }

int64_t first_exploded(const Tensor& t) { return first_beyond(t, true, "first_exploded"); }

std::string non_finite_name(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::f32) {
    const float v = t.data<float>()[i];
    return std::isnan(v) ? "NaN" : v > 0 ? "inf" : "-inf";
  }
  const uint16_t b = t.half_bits()[i];
  const uint16_t mantissa = t.dtype() == DType::bf16 ? kBf16Mantissa : kF16Mantissa;
  return (b & mantissa) ? "NaN" : (b & 0x8000) ? "-inf" : "inf";
}

void check_finite(const std::string& where, const std::string& name, const Tensor& tensor) {
  const int64_t i = first_non_finite(tensor);
  if (i < 0) return;
  throw Error(str(where, ": tensor '", name, "' holds a non-finite value (",
                  non_finite_name(tensor, i), " at element ", i, " of ", shape_str(tensor.shape()),
                  ")"));
}

void check_not_exploded(const std::string& where, const std::string& name, const Tensor& tensor) {
  const int64_t i = first_exploded(tensor);
  if (i < 0) return;
  check_finite(where, name, tensor);  // NaN or Inf: that message
  const float value = tensor.dtype() == DType::f32 ? tensor.data<float>()[i]
                                                   : kernels::bf16_to_f32(tensor.half_bits()[i]);
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", static_cast<double>(value));
  throw Error(str(where, ": tensor '", name, "' holds ", text, " at element ", i, " of ",
                  shape_str(tensor.shape()),
                  ": a weight of 2^32 or more has exploded (a model holding one computes "
                  "infinite, then NaN, activations)"));
}

void check_finite_expert(const std::string& where, const std::string& name, const Tensor& slice,
                         int64_t expert, const Shape& whole, int64_t offset) {
  const Tensor host = slice.device().kind == Device::cpu ? slice : slice.to(Device{});
  const int64_t i = first_non_finite(host);
  if (i < 0) return;
  const int64_t per_expert = whole.empty() || whole[0] == 0 ? 0 : shape_numel(whole) / whole[0];
  throw Error(str(where, ": tensor '", name, "' holds a non-finite value (",
                  non_finite_name(host, i), " at element ", expert * per_expert + offset + i,
                  " of ", shape_str(whole), ", expert ", expert, ")"));
}

void check_finite(const std::string& where, const std::vector<NamedTensor>& tensors) {
  for (const NamedTensor& nt : tensors) {
    if (!nt.streamed()) {  // a deferred tensor is read here, and released after the check
      check_finite(where, nt.name, nt.whole());
      continue;
    }
    for (int64_t e = 0; e < nt.shape()[0]; ++e)
      check_finite_expert(where, nt.name, nt.expert_slice(e), e, nt.shape());
  }
}

void check_finite_when_read(const std::string& where, std::vector<NamedTensor>& tensors) {
  for (NamedTensor& nt : tensors) {
    if (nt.held()) {
      check_finite(where, nt.name, nt.tensor);
      continue;
    }
    const Shape whole = nt.shape();
    const std::string name = nt.name;
    nt = map_tensor(nt, whole, nt.dtype(), [where, name, whole](const Tensor& x, int64_t e) {
      if (e < 0)
        check_finite(where, name, x);
      else
        check_finite_expert(where, name, x, e, whole);
      return x;
    });
  }
}

}  // namespace moe::io
