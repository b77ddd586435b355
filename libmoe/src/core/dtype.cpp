#include "moe/dtype.h"

#include "moe/error.h"

namespace moe {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
    case DType::q8_0:
    case DType::q4_k:
    case DType::q6_k:
    case DType::mxfp4:
      return 1;
  }
  throw Error("dtype_size: unknown dtype");
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::q8_0:
      return "q8_0";
    case DType::q4_k:
      return "q4_k";
    case DType::q6_k:
      return "q6_k";
    case DType::mxfp4:
      return "mxfp4";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32" || name == "fp32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "f16" || name == "float16" || name == "fp16") return DType::f16;
  if (name == "i32") return DType::i32;
  if (name == "i64") return DType::i64;
  if (name == "u8") return DType::u8;
  throw UsageError(str("unknown dtype '", name, "' (expected f32, bf16 or f16)"));
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

bool is_quantized(DType dtype) {
  return dtype == DType::q8_0 || dtype == DType::q4_k || dtype == DType::q6_k ||
         dtype == DType::mxfp4;
}

}  // namespace moe
