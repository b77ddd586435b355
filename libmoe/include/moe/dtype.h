// Element types of tensors. Compute is fp32; bf16/f16 are storage types. The quantised weight
// types hold bytes the CPU kernels read in place, in memory only (files hold them as u8, a loaded
// model turns them into these; one byte per element of the tensor's bytes, so a weight [.., out,
// in] is a tensor [.., out, row bytes]): q8_0, Q8_0 weights in the decode kernels' row groups
// (backend/cpu/gemv.h); q4_k, q6_k, mxfp4, rows of llama.cpp's blocks of that format exactly as
// GGUF stores them (backend/cpu/quant_blocks.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moe {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, u8, q8_0, q4_k, q6_k, mxfp4 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
DType parse_dtype(std::string_view name);  // throws UsageError naming the accepted values
bool is_floating(DType dtype);
// q8_0, q4_k, q6_k, mxfp4: a quantised weight as the CPU kernels read it (x W^T, inference only).
bool is_quantized(DType dtype);

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
