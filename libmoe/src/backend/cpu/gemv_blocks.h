// The decode GEMV over block-format weights (gemv.h; q4_k, q6_k, mxfp4 rows, quant_blocks.h): the
// input side and the row kernel. Not part of the library's interface.
// Shapes: m input rows of `in` elements, out x in weights, in a whole number of blocks.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cpu/gemv.h"
#include "backend/cpu/quant_blocks.h"

namespace moe::cpu::gemv_detail {

// m input rows quantised once per gemv_batch call to the weights' partner format (dot_partner:
// q8_k for q4_k and q6_k, ggml's q8_0 blocks for mxfp4) with quantize_row, row after row
// (row_bytes each). A row the partner cannot hold (a NaN or an infinity; for q8_0, a block beyond
// its f16 scale's range) is marked, and its products are NaN, as the f32 GEMV's would be
// non-finite. Reused between calls (decode allocates nothing once warm).
struct BlockInput {
  const float* x = nullptr;  // the source rows, as given (a batch's problems may share them)
  int64_t ldx = 0, m = 0, in = 0, row_bytes = 0;
  BlockFormat partner = BlockFormat::q8_k;
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> usable;  // [m]: 0 where the row could not be quantised

  void build(const float* rows, int64_t ld, int64_t count, int64_t n, BlockFormat to);
  bool holds(const float* rows, int64_t ld, int64_t count, int64_t n, BlockFormat to) const {
    return x == rows && ldx == ld && m == count && in == n && partner == to;
  }
  const uint8_t* row(int64_t i) const { return bytes.data() + i * row_bytes; }
};

// cpu::dot_row(weights, wrow, arow, n), bit for bit (the same exact integer sums per block and
// the same f32 operations), in loops over whole sub-blocks that the compiler vectorises.
float dot_block_row(BlockFormat weights, const uint8_t* wrow, const uint8_t* arow, int64_t n);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Its x86 copies (gemv_blocks_simd.h; the same bits): AVX2, AVX-512 without VNNI, AVX-512 VNNI.
// Each runs only where the CPU has its instruction set (gemv_isa_supported).
float dot_block_row_avx2(BlockFormat weights, const uint8_t* wrow, const uint8_t* arow, int64_t n);
float dot_block_row_avx512(BlockFormat weights, const uint8_t* wrow, const uint8_t* arow,
                           int64_t n);
float dot_block_row_vnni(BlockFormat weights, const uint8_t* wrow, const uint8_t* arow, int64_t n);
#endif

using DotBlockRow = float (*)(BlockFormat, const uint8_t*, const uint8_t*, int64_t);
// The copy of dot_block_row a GEMV path runs: scalar (also where the build has no x86 copies),
// avx2, avx512 or avx512_vnni (isa resolved: not best). The caller checks gemv_isa_supported.
DotBlockRow dot_block_row_for(GemvIsa isa);

// Output rows [begin, end) of problem p (block-format weights) against its quantised inputs x:
// y[i, o] = dot_row(W[o], x[i]) (+ beta y; `dot`, a copy of dot_block_row), one output at a time.
void block_rows(const GemvProblem& p, const BlockInput& x, int64_t begin, int64_t end,
                DotBlockRow dot);

// Rows [row, row + rows) of block-format w dequantised into out [rows, in] (dequantize_row).
void widen_block_rows(const WeightMatrix& w, int64_t row, int64_t rows, float* out);

}  // namespace moe::cpu::gemv_detail
