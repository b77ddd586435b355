// Matrix-vector products for decode steps: y[i, o] = sum_j W[o, j] x[i, j] for a few input rows
// (i < kGemvMaxRows) and a weight matrix W [out, in] stored row-major in f32, bf16, f16, Q8_0 or
// one of llama.cpp's block formats (q4_k, q6_k, mxfp4; gemv_blocks.h).
// Shapes: m input rows, out x in weights.
//
// A decode step reads every active weight once and does two flops per weight: it is bound by
// memory bandwidth, not arithmetic, so the kernel streams each weight row once, widens it to f32
// in registers (bf16: a shift; f16: vcvtph2ps; Q8_0: int8 times the block's f16 scale, exact in
// f32) and multiplies it with all m input rows while it is there. Threads split the output rows
// of every problem of a batch together (the two routed experts of a token share both threads), as
// tasks of the decode task pool (task_pool.h), not an OpenMP loop.
//
// Determinism by construction: each output element is computed by one thread with one fixed order
// (16 lanes, lane l summing elements l, l + 16, ... with fused multiply-adds, then a fixed tree
// over the lanes), whatever the thread count, m, or the instruction set (the scalar fallback
// computes the same lanes with std::fma). Widening is exact, so the f32, bf16 and f16 results
// equal, bit for bit, the f32 GEMV of the widened weights.
//
// Q8_0 weights multiply 8-bit input rows instead (as llama.cpp does, with ggml's activation blocks:
// f16 scales): each input row is quantised once per call, per block of 32
// (quantize_q8_input_row), and a block's products are summed in
// integers, exactly (AVX-512 VNNI vpdpbusd, or vpmaddubsw + vpmaddwd without VNNI, or scalar).
// Lane l of block pair t holds the integer sum over elements 64 t + 4 l .. + 3; it is scaled by
// (weight scale x input scale) of its block and added to an f32 lane with a fused multiply-add,
// pair after pair; the same tree ends it. Every path computes those exact integers and the same
// f32 operations, so the bits agree across paths and thread counts; against the f32 GEMV of the
// dequantised weights the result differs by the input rows' rounding (per element at most
// |x| max / 254 of its block plus 127 times the f16 rounding of the block's scale: below
// |x| max (1 / 254 + 2^-11) for a normal f16 scale), which bounds the error by that times sum |w|
// over each block.
//
// Block-format weights (q4_k, q6_k, mxfp4: llama.cpp's rows, gemv_blocks.h) multiply input rows
// quantised once per call to the format's partner (q8_k; q8_0 blocks for mxfp4) with
// cpu::dot_row, one output at a time: exact integer sums per block, combined in f32 block after
// block, as ggml's reference dot products do, so any thread count gives the same bits. The sums
// are formed by a scalar body or its AVX2, AVX-512 or AVX-512 VNNI copy (gemv_blocks_simd.h),
// the same bits on every copy.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/cpu/quant_blocks.h"
#include "moe/dtype.h"

namespace moe::cpu {

enum class WeightFormat : uint8_t { f32, bf16, f16, q8_0, q4_k, q6_k, mxfp4 };
const char* weight_format_name(WeightFormat format);
// q4_k, q6_k, mxfp4: rows of llama.cpp's blocks (block_row_bytes(block_format(f), in) bytes a row).
bool is_block_format(WeightFormat format);
BlockFormat block_format(WeightFormat format);  // moe::Error unless is_block_format

// Q8_0-like (see docs/ARCHITECTURE.md): blocks of kQ8Block consecutive elements along `in`, each
// with one f16 scale; value = scale * q, q int8 in [-127, 127]. A row's last block may be shorter
// when `in` is not a multiple of kQ8Block. A row is stored as its `in` int8 values followed by its
// q8_blocks(in) scales (f16 bits, little-endian): q8_row_bytes(in) bytes, rows back to back, as
// files hold them (the kernels read row groups, below). Not llama.cpp's bytes: its blocks
// interleave scale and values (values first keeps a row sliceable and its bytes a function of
// `in` alone), and q rounds to nearest even against the stored f16 scale (quantize_q8_0_row); the
// GGUF export writes llama.cpp's own.
inline constexpr int64_t kQ8Block = 32;
inline int64_t q8_blocks(int64_t in) { return (in + kQ8Block - 1) / kQ8Block; }
inline int64_t q8_row_bytes(int64_t in) { return in + 2 * q8_blocks(in); }
// The inverse: the `in` whose rows take `bytes`, or 0 when no row does. Rows of b blocks take
// (34 b - 32, 34 b] bytes, so b = ceil(bytes / 34).
inline int64_t q8_in_of_row_bytes(int64_t bytes) {
  if (bytes <= 0) return 0;
  const int64_t in = bytes - 2 * ((bytes + kQ8Block + 1) / (kQ8Block + 2));
  return q8_row_bytes(in) == bytes ? in : 0;
}

// Q8_0 row groups: the same blocks as the kernels read them (WeightFormat::q8_0, DType::q8_0
// tensors; files keep the rows above, pack_q8_0 turns them into groups when a model is loaded).
// The kernels take a pair of blocks (64 elements) of 8 rows at a time; in rows those are 8 reads
// a row apart, which the hardware prefetchers do not follow, so a matrix's rows are stored in
// groups of kQ8Group (the last group of a matrix holds the out % 8 left, if any), each group pair
// after pair: for pair t, the g rows' 64 values (int8, row after row; 0 past `in`), then their
// scales (2 f16 each: blocks 2 t and 2 t + 1, 0 for a block past the last). A pair of g rows
// takes g * 68 bytes, so a row takes q8_group_row_bytes(in) = 68 * q8_pairs(in) bytes (its rows'
// q8_row_bytes(in) when `in` is a multiple of 64), and group G of a matrix starts at row 8 G's
// share. One decode GEMV then reads each group front to back: a single stream.
inline constexpr int64_t kQ8Group = 8;
inline constexpr int64_t kQ8PairBytes = 2 * kQ8Block + 4;  // one row's pair: 64 values, 2 scales
inline int64_t q8_pairs(int64_t in) { return (in + 2 * kQ8Block - 1) / (2 * kQ8Block); }
inline int64_t q8_group_row_bytes(int64_t in) { return kQ8PairBytes * q8_pairs(in); }

// A weight matrix [out, in], row-major, rows back to back: `in` elements each (f32, bf16, f16),
// Q8_0 row groups of q8_group_row_bytes(in) bytes a row, or block rows of
// block_row_bytes(block_format(format), in) bytes a row.
struct WeightMatrix {
  WeightFormat format = WeightFormat::f32;
  const void* data = nullptr;
  int64_t out = 0, in = 0;
};

// One product: y[i, o] = dot(W[o, :], x[i, :]) + beta * y[i, o] (beta 0: y is not read).
struct GemvProblem {
  WeightMatrix w;
  const float* x = nullptr;
  int64_t ldx = 0;
  int64_t m = 0;  // input rows, 1 .. kGemvMaxRows
  float* y = nullptr;
  int64_t ldy = 0;
  float beta = 0.0f;
};

// Above this many input rows the weights are widened once into a scratch and multiplied by the
// tiled sgemm (see widen_rows): reuse of each weight over many rows makes that compute-bound.
inline constexpr int64_t kGemvMaxRows = 8;

// Independent problems (their y regions must not overlap) in one parallel loop over blocks of
// output rows. `isa` forces a path (tests, benchmarks); the default is the best this CPU has.
// avx512 and avx512_vnni differ only for Q8_0 and the block formats (how the integer sums are
// formed; same values). avx2 has copies for the block formats only: other formats take the
// scalar path under it (as they do on a CPU without AVX-512). Every path gives the same bits.
enum class GemvIsa { best, scalar, avx512, avx512_vnni, avx2 };
void gemv_batch(const GemvProblem* problems, size_t count, GemvIsa isa = GemvIsa::best);
bool gemv_isa_supported(GemvIsa isa);

// Rows [row, row + rows) of w widened to f32 into out [rows, in] (exact for every format; block
// rows give dequantize_row's floats).
void widen_rows(const WeightMatrix& w, int64_t row, int64_t rows, float* out);

// One matrix [out, in] of Q8_0 rows (q8_row_bytes(in) bytes each) as row groups
// (q8_group_row_bytes(in) bytes a row, `groups` holds out times that), and back.
void pack_q8_0(const uint8_t* rows, int64_t out, int64_t in, uint8_t* groups);
void unpack_q8_0(const uint8_t* groups, int64_t out, int64_t in, uint8_t* rows);
// One Q8_0 row of n elements (q8_row_bytes(n) bytes) dequantised: scale * q, exact in f32.
void dequantize_q8_0_row(const uint8_t* row, int64_t n, float* out);
// Q8_0 quantisation of one row of n floats into q8_row_bytes(n) bytes: per block, scale =
// max|x| / 127 rounded to f16 (the stored scale, so dequantisation uses exactly it), q =
// round-to-nearest-even(x / scale) clamped to [-127, 127]; then |x - scale q| <= scale / 2. An
// all-zero block has scale 0 and q 0 (as does a block below 127 * 2^-25, where the f16 scale
// underflows). Non-finite input, or a block beyond 127 * 65504, throws.
void quantize_q8_0_row(const float* x, int64_t n, uint8_t* row);
// The scale of block b of a Q8_0 row of n elements.
float q8_scale(const uint8_t* row, int64_t n, int64_t b);

// An input row of n floats as the Q8_0 GEMV multiplies it, as ggml's CPU backend quantises the
// activations of its q8_0 products (quantize_row_q8_0, x86): per block b of kQ8Block, with
// s = max|x| / 127 in f32, q = round-to-nearest-even(x * (127 / max|x|)) clamped to [-127, 127]
// (within half a step of x / s), and scale[b] = s rounded to f16, the scale the products use
// (s itself beyond f16's range, where ggml's is infinite). Then |x - scale[b] q| <= s / 2 +
// 127 |scale[b] - s|: below max|x| (1 / 254 + 2^-11) for a normal f16 scale. A block whose f16
// scale is 0 (all zero, or max|x| below 127 x 2^-25) has scale 0 and q 0. A block holding a NaN or
// an infinity gets q 0 and scale NaN, so the products it enters come out NaN (as the f32 GEMV's
// would be non-finite). q has n elements, scale q8_blocks(n).
void quantize_q8_input_row(const float* x, int64_t n, int8_t* q, float* scale);

}  // namespace moe::cpu

// ---- glue for the GEMM entry points (core_ops.cpp, grouped_gemm.cpp) ----
namespace moe {
class Tensor;
}
namespace moe::cpu {

// A u8 tensor of Q8_0 rows [.., out, q8_row_bytes(in)] (as files hold them) as a DType::q8_0
// tensor of row groups [.., out, q8_group_row_bytes(in)], each matrix packed on its own.
Tensor pack_q8_0(const Tensor& rows, int64_t in);

// A u8 tensor of block rows [.., out, block_row_bytes(format, in)] (as files hold them, GGUF's
// bytes) as the tensor the kernels read: the same bytes and shape, DType q4_k, q6_k or mxfp4.
// `format` must be a weight format (not q8_k or q8_0).
Tensor block_rows(const Tensor& rows, BlockFormat format);
DType dtype_of_block_format(BlockFormat format);  // moe::Error for q8_k and q8_0

// Matrix `index` of a weight tensor [.., out, in] (f32, bf16 or f16), of a DType::q8_0 tensor
// [.., out, q8_group_row_bytes(in)] holding Q8_0 row groups, or of a q4_k / q6_k / mxfp4 tensor
// [.., out, block row bytes] (`in` given for those two), as the kernels read it.
WeightMatrix weight_matrix(const Tensor& w, int64_t index = 0, int64_t in = 0);
// The elements a row of weight w holds when a product asks for k: k where w is quantised (its
// last dimension counts bytes) and its rows hold exactly k elements, else w's last dimension (so
// the caller's shape check names the mismatch).
int64_t weight_row_elements(const Tensor& w, int64_t k);

// Whether a product of m rows by a transposed weight goes to the GEMV. Benchmarks may turn the
// path off (set_gemv_enabled(false)) to time the tiled sgemm it replaces in the same run.
bool gemv_applies(int64_t m);
void set_gemv_enabled(bool enabled);

// `w` widened to f32 into a scratch kept by the calling thread (reused: prefill allocates once),
// for the tiled sgemm; f32 weights are returned as they are. widened_rows: rows [row, row + rows)
// only (a panel of a weight too big to widen whole).
const float* widened(const WeightMatrix& w, int64_t slot = 0);
const float* widened_rows(const WeightMatrix& w, int64_t row, int64_t rows, int64_t slot = 0);
// What the tiled products widen at once: a 16-bit or quantised weight of more floats than this
// is widened a panel of rows at a time, and a grouped product's experts a group at a time, so
// the scratch stays at 32 Mi floats (128 MiB) a thread whatever the model (an f32 copy of a
// 50k x 2k LM head was 412 MB, of 64 experts 512 MB, kept for the process's life).
constexpr int64_t kWidenedFloats = int64_t(1) << 25;

}  // namespace moe::cpu
