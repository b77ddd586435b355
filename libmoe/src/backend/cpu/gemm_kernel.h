// The tile kernels of cpu::sgemm (gemm.cpp cuts C into tiles fixed by the shape; each tile is one
// call of one of these, on one thread). Which kernel runs is chosen once per process from the
// CPU's features alone (never from timings), so a host always computes the same bits:
//   blas   -- one single-threaded CBLAS call (OpenBLAS by default): every host.
//   avx512 -- ours (gemm_avx512.cpp): packed panels, a 14 x 32 register-blocked FMA micro-kernel.
//             K is cut into blocks of gemm_avx512_k_block(K); every element of C is, per block,
//             one FMA chain from zero over its k in order, the block sums added in order, then
//             alpha * sum (+ beta * C by one FMA): its bits depend on its row of op(A), its
//             column of op(B) and K only, never on the tile, the other rows in the call or the
//             thread.
// Shapes: C [M,N] = alpha op(A) [M,K] op(B) [K,N] + beta C, row-major.
#pragma once
#include <cstdint>

#include "backend/cpu/gemm.h"

namespace moe::cpu {

// True when this CPU runs the AVX-512 kernel (AVX-512 F, FMA; checked at run time: the library
// itself targets baseline x86-64).
bool gemm_avx512_supported();

// The k block of the AVX-512 kernel for a product of depth k: at most 256, equal blocks.
int64_t gemm_avx512_k_block(int64_t k);

// One tile of `p`: rows [0, m) and columns [0, n) of C at `c`, with `a` at row 0 of op(A) and `b`
// at column 0 of op(B) (leading dimensions, transposes, K, alpha and beta from `p`). K >= 1.
// Needs gemm_avx512_supported(). Scratch is per thread and reused.
// `call` (non-zero: one sgemm_batch call, numbered by gemm_next_call) lets a thread keep the
// packed panels of a tile for its next tile of the same call with the same rows of op(A) or
// columns of op(B) (the tiles of one tile row or column), instead of packing them again: within a
// call the operands are read only, between calls the same address may hold other values. 0 packs
// every time. Packing copies values, so this never changes a bit of C.
void sgemm_tile_avx512(const GemmProblem& p, int64_t m, int64_t n, const float* a, const float* b,
                       float* c, uint64_t call = 0);
// A fresh call number for sgemm_tile_avx512 (never 0; thread-safe).
uint64_t gemm_next_call();

}  // namespace moe::cpu
