// Host tensor storage for the CPU table: allocation (the current ArenaScope's arena when one is
// active), byte copies, dtype conversion through fp32, fill and zero.
#include <cstring>

#include "backend/cpu/backend.h"
#include "kernels/convert.h"
#include "moe/arena.h"

namespace moe::cpu {

std::shared_ptr<std::byte> allocate(size_t bytes, int) {
  if (Arena* arena = ArenaScope::current()) return arena->allocate(bytes);
  return std::shared_ptr<std::byte>(new std::byte[bytes], std::default_delete<std::byte[]>());
}

void copy(Tensor& dst, const Tensor& src) { std::memcpy(dst.raw(), src.raw(), dst.nbytes()); }

void convert(const Tensor& other, Tensor& dst) {
  const int64_t n = dst.numel();
  // Through fp32.
  auto load = [&](int64_t i) -> float {
    switch (other.dtype()) {
      case DType::f32:
        return other.data<float>()[i];
      case DType::bf16:
        return kernels::bf16_to_f32(other.half_bits()[i]);
      default:
        return kernels::f16_to_f32(other.half_bits()[i]);
    }
  };
  switch (dst.dtype()) {
    case DType::f32: {
      float* d = dst.data<float>();
      for (int64_t i = 0; i < n; ++i) d[i] = load(i);
      break;
    }
    case DType::bf16: {
      uint16_t* d = dst.half_bits();
      for (int64_t i = 0; i < n; ++i) d[i] = kernels::f32_to_bf16(load(i));
      break;
    }
    default: {
      uint16_t* d = dst.half_bits();
      for (int64_t i = 0; i < n; ++i) d[i] = kernels::f32_to_f16(load(i));
      break;
    }
  }
}

void fill(Tensor& t, float value) {
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::f32: {
      float* d = t.data<float>();
      for (int64_t i = 0; i < n; ++i) d[i] = value;
      break;
    }
    case DType::bf16:
    case DType::f16: {
      uint16_t bits =
          t.dtype() == DType::bf16 ? kernels::f32_to_bf16(value) : kernels::f32_to_f16(value);
      uint16_t* d = t.half_bits();
      for (int64_t i = 0; i < n; ++i) d[i] = bits;
      break;
    }
    case DType::i32: {
      int32_t* d = t.data<int32_t>();
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<int32_t>(value);
      break;
    }
    default:
      throw Error(str("fill: unsupported dtype for ", t.describe()));
  }
}

void zero(Tensor& t) { std::memset(t.raw(), 0, t.nbytes()); }

}  // namespace moe::cpu
