// Matrix-vector products for decode steps: y[i, o] = sum_j W[o, j] x[i, j] for a few input rows
// (i < kGemvMaxRows) and a weight matrix W [out, in] stored row-major in f32, bf16, f16 or Q8_0.
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
// computes the same lanes with std::fma). Widening is exact, so every format's result equals,
// bit for bit, the f32 GEMV of its widened (dequantised) weights.
#pragma once
#include <cstddef>
#include <cstdint>

namespace moe::cpu {

enum class WeightFormat : uint8_t { f32, bf16, f16, q8_0 };
const char* weight_format_name(WeightFormat format);

// Q8_0-like (see docs/ARCHITECTURE.md): blocks of kQ8Block consecutive elements along `in`, each
// with one f16 scale; value = scale * q, q int8 in [-127, 127]. A row's last block may be shorter
// when `in` is not a multiple of kQ8Block. A row is stored as its `in` int8 values followed by its
// q8_blocks(in) scales (f16 bits, little-endian): q8_row_bytes(in) bytes, rows back to back. Not
// llama.cpp's bytes: its blocks interleave scale and values (values first keeps the int8 loads of
// a row contiguous and a row's bytes a function of `in` alone), and q rounds to nearest even
// against the stored f16 scale (quantize_q8_0_row); the GGUF export writes llama.cpp's own.
inline constexpr int64_t kQ8Block = 32;
inline int64_t q8_blocks(int64_t in) { return (in + kQ8Block - 1) / kQ8Block; }
inline int64_t q8_row_bytes(int64_t in) { return in + 2 * q8_blocks(in); }

// A weight matrix [out, in], row-major, rows back to back: `in` elements each (f32, bf16, f16)
// or q8_row_bytes(in) bytes (Q8_0).
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
enum class GemvIsa { best, scalar, avx512 };
void gemv_batch(const GemvProblem* problems, size_t count, GemvIsa isa = GemvIsa::best);
bool gemv_isa_supported(GemvIsa isa);

// Rows [row, row + rows) of w widened to f32 into out [rows, in] (exact for every format).
void widen_rows(const WeightMatrix& w, int64_t row, int64_t rows, float* out);

// Q8_0 quantisation of one row of n floats into q8_row_bytes(n) bytes: per block, scale =
// max|x| / 127 rounded to f16 (the stored scale, so dequantisation uses exactly it), q =
// round-to-nearest-even(x / scale) clamped to [-127, 127]; then |x - scale q| <= scale / 2. An
// all-zero block has scale 0 and q 0 (as does a block below 127 * 2^-25, where the f16 scale
// underflows). Non-finite input, or a block beyond 127 * 65504, throws.
void quantize_q8_0_row(const float* x, int64_t n, uint8_t* row);
// The scale of block b of a Q8_0 row of n elements.
float q8_scale(const uint8_t* row, int64_t n, int64_t b);

}  // namespace moe::cpu

// ---- glue for the GEMM entry points (core_ops.cpp, grouped_gemm.cpp) ----
namespace moe {
class Tensor;
}
namespace moe::cpu {

// Matrix `index` of a weight tensor [.., out, in] (f32, bf16 or f16) or of a u8 tensor
// [.., out, q8_row_bytes(in)] holding Q8_0 rows (`in` given), as the kernels read it.
WeightMatrix weight_matrix(const Tensor& w, int64_t index = 0, int64_t in = 0);

// Whether a product of m rows by a transposed weight goes to the GEMV. Benchmarks may turn the
// path off (set_gemv_enabled(false)) to time the tiled sgemm it replaces in the same run.
bool gemv_applies(int64_t m);
void set_gemv_enabled(bool enabled);

// `w` widened to f32 into a scratch kept by the calling thread (reused: prefill allocates once),
// for the tiled sgemm; f32 weights are returned as they are.
const float* widened(const WeightMatrix& w, int64_t slot = 0);

}  // namespace moe::cpu
