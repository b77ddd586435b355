// GGUF's block-quantised tensor types (q8_0, q4_k, q6_k, mxfp4) as the block formats of
// backend/cpu/quant_blocks.h, which hold their byte layouts and codecs: the reader, the writer and
// the importer size, encode and decode them through this one mapping. Private to libmoe.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/quant_blocks.h"
#include "moe/io/gguf.h"

namespace moe::io {

// Whether `t` is stored in blocks (q8_0 or a 4/6-bit type), and which.
inline bool is_blocked(GgufType t) { return t == GgufType::q8_0 || is_block_type(t); }
inline cpu::BlockFormat block_format_of(GgufType t) {
  switch (t) {
    case GgufType::q4_k:
      return cpu::BlockFormat::q4_k;
    case GgufType::q6_k:
      return cpu::BlockFormat::q6_k;
    case GgufType::mxfp4:
      return cpu::BlockFormat::mxfp4;
    default:  // q8_0 (is_blocked callers only)
      return cpu::BlockFormat::q8_0;
  }
}

// llama.cpp's Q8_0 blocks (f16 d, 32 int8) of `rows` rows of `in` values as our Q8_0 rows
// (backend/cpu/gemv.h: the row's int8 values, then its f16 scales): the same bytes, rearranged.
// A scale that is negative or not finite, or a value of -128, is no Q8_0 llama.cpp writes and
// outside our kernels' range: moe::Error naming `where`, the row and the block.
std::vector<uint8_t> q8_blocks_to_rows(const std::string& where, const uint8_t* blocks,
                                       int64_t rows, int64_t in);

}  // namespace moe::io
