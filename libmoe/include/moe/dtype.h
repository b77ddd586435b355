// Element types of tensors. Compute is fp32; bf16/f16 are storage types. q8_0: the bytes of Q8_0
// weights in the decode kernels' row groups (backend/cpu/gemv.h), in memory only: files hold Q8_0
// rows as u8, and a loaded model packs them (one byte per element of the tensor's bytes).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moe {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, u8, q8_0 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
DType parse_dtype(std::string_view name);  // throws UsageError naming the accepted values
bool is_floating(DType dtype);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}

}  // namespace moe
