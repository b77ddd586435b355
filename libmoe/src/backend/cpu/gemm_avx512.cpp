// The AVX-512 tile kernel of cpu::sgemm (gemm_kernel.h): the tile's rows of op(A) and columns of
// op(B) are copied into panels (kRows rows of A, kCols columns of B, k-major, zero-padded at the
// edges), and a register-blocked micro-kernel keeps a kRows x kCols block of C in 28 zmm
// registers while it runs over k, one broadcast of A times two vectors of B per row and k. The
// panels of a tile's whole K are kept for the thread's next tile of the same sgemm_batch call that
// shares them (the tiles of one tile row share op(A)'s, of one column op(B)'s).
// Shapes: C [M,N] = alpha op(A) [M,K] op(B) [K,N] + beta C, row-major; kc = the k block.
//
// Why our own: the environment pins OpenBLAS to its AVX2 kernels on AVX-512 hosts
// (OPENBLAS_CORETYPE), which halves GEMM speed there, and the environment is not ours to change.
//
// Bits: K is cut into gemm_avx512_k_block(K)-sized blocks (a function of K alone, at most 256:
// the panels stay in cache). Each element is, per block, one FMA chain from zero over the block's
// k in order; the block sums are added in block order (kept in a per-thread buffer between
// blocks); then alpha * sum (+ beta * C by one more FMA). The same bits whatever the tile, the
// rows beside it or the thread. (Adding block sums rather than continuing one chain over all K
// keeps the rounding error near (256 + K / 256) u rather than K u.)
//
// The whole file is compiled for AVX-512 through target attributes, not -m flags, so that nothing
// it instantiates from headers can be picked by the linker for code that runs on other CPUs; it
// is only called after gemm_avx512_supported() said yes.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>

#include "backend/cpu/gemm_kernel.h"
#include "moe/error.h"

namespace moe::cpu {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#define MOE_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))

// GCC 12's unpack intrinsics start from _mm512_undefined_ps(), which -Wmaybe-uninitialized reports
// once inlined here (a false positive: every lane is written).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace {

// 14 x 32: 28 accumulators + 2 vectors of B + 1 broadcast of A fit the 32 zmm registers, and
// 28 independent FMA chains cover the FMA latency of two pipes.
constexpr int64_t kVectors = 2;  // zmm vectors along a row of the C block
constexpr int64_t kRows = 14, kCols = 16 * kVectors;
// The k block: a 14 x 256 panel of A (14 KiB) and a 256 x 32 panel of B (32 KiB) share L1, and a
// tile's packed B (at most 256 x 256 floats) stays in L2.
constexpr int64_t kMaxKc = 256;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A 64-byte aligned, growing, per-thread buffer (reused by every tile a thread runs).
class Buffer {
 public:
  float* get(int64_t floats) {
    if (floats > capacity_) {
      const size_t bytes = static_cast<size_t>(ceil_div(floats * 4, 64) * 64);
      float* p = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (!p) throw std::bad_alloc();
      data_.reset(p);
      capacity_ = floats;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  int64_t capacity_ = 0;
};

// What a packed buffer holds: the whole K of `extent` rows of op(A) (or columns of op(B)) from
// `src`, packed in sgemm_batch call `call` (0: nothing kept).
struct PackedKey {
  const float* src = nullptr;
  int64_t extent = 0, k = 0, ld = 0;
  bool transpose = false;
  uint64_t call = 0;
  bool operator==(const PackedKey&) const = default;
};

struct Workspace {
  Buffer a, b, sums;
  PackedKey a_key, b_key;
};
thread_local Workspace t_workspace;

// Whole-K panels are kept for the next tile up to this many floats per operand (4 MiB: a tile's
// 256 rows by K 4096); longer ones are packed a k block at a time, as they are used.
constexpr int64_t kKeepFloats = int64_t(1) << 20;

// Lanes [0, count) of a 16-lane vector (count may be <= 0 or >= 16).
MOE_TARGET_AVX512 inline __mmask16 lanes(int64_t count) {
  if (count <= 0) return 0;
  if (count >= 16) return 0xffff;
  return static_cast<__mmask16>((1u << count) - 1u);
}

// The 16 x 16 block at `src` (row stride lds; rows [0, rows) and columns [0, cols) read, the
// rest taken as zero) transposed: out[c] holds column c. Three rounds of in-lane and cross-lane
// shuffles instead of 256 scalar loads and stores: packing reads A along k and B^T along k, and
// both panels want k-major rows.
MOE_TARGET_AVX512 inline void transpose_16x16(const float* src, int64_t lds, int64_t rows,
                                              int64_t cols, __m512 out[16]) {
  const __mmask16 mask = lanes(cols);
  __m512 r[16], t[16];
  for (int64_t i = 0; i < 16; ++i)
    r[i] = i < rows ? _mm512_maskz_loadu_ps(mask, src + i * lds) : _mm512_setzero_ps();
  // Pairs of rows interleaved, then pairs of pairs: per 128-bit lane l, t[4g + j] holds column
  // 4l + j of rows 4g .. 4g + 3.
  for (int64_t i = 0; i < 16; i += 2) {
    out[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    out[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int64_t g = 0; g < 4; ++g) {
    const __m512d a = _mm512_castps_pd(out[4 * g]), b = _mm512_castps_pd(out[4 * g + 1]),
                  c = _mm512_castps_pd(out[4 * g + 2]), d = _mm512_castps_pd(out[4 * g + 3]);
    t[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    t[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    t[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    t[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // Gather lane l of the four row groups: column 4l + j.
  for (int64_t j = 0; j < 4; ++j) {
    const __m512 even_lo = _mm512_shuffle_f32x4(t[j], t[4 + j], 0x88);       // lanes 0, 2: rows 0-7
    const __m512 odd_lo = _mm512_shuffle_f32x4(t[j], t[4 + j], 0xdd);        // lanes 1, 3: rows 0-7
    const __m512 even_hi = _mm512_shuffle_f32x4(t[8 + j], t[12 + j], 0x88);  // rows 8-15
    const __m512 odd_hi = _mm512_shuffle_f32x4(t[8 + j], t[12 + j], 0xdd);
    out[j] = _mm512_shuffle_f32x4(even_lo, even_hi, 0x88);
    out[8 + j] = _mm512_shuffle_f32x4(even_lo, even_hi, 0xdd);
    out[4 + j] = _mm512_shuffle_f32x4(odd_lo, odd_hi, 0x88);
    out[12 + j] = _mm512_shuffle_f32x4(odd_lo, odd_hi, 0xdd);
  }
}

// Rows [0, m) of op(A), k in [k0, k0 + kc), as panels of kRows rows: panel p holds rows
// p * kRows.. as [kc][kRows] (row r of k at k * kRows + r), rows past m zero.
MOE_TARGET_AVX512 void pack_a(const GemmProblem& p, const float* a, int64_t m, int64_t k0,
                              int64_t kc, float* out) {
  constexpr __mmask16 kPanelLanes = (1u << kRows) - 1u;
  for (int64_t i0 = 0; i0 < m; i0 += kRows) {
    const int64_t rows = std::min(kRows, m - i0);
    float* panel = out + i0 * kc;
    if (p.transpose_a) {  // A is [K, M]: a panel's rows are contiguous for each k
      const __mmask16 mask = lanes(rows);
      for (int64_t k = 0; k < kc; ++k)
        _mm512_mask_storeu_ps(panel + k * kRows, kPanelLanes,
                              _mm512_maskz_loadu_ps(mask, a + (k0 + k) * p.lda + i0));
    } else {  // A is [M, K]: 16 k of the panel's rows at a time, transposed
      __m512 columns[16];
      for (int64_t k = 0; k < kc; k += 16) {
        const int64_t count = std::min<int64_t>(16, kc - k);
        transpose_16x16(a + i0 * p.lda + k0 + k, p.lda, rows, count, columns);
        for (int64_t c = 0; c < count; ++c)
          _mm512_mask_storeu_ps(panel + (k + c) * kRows, kPanelLanes, columns[c]);
      }
    }
  }
}

// Columns [0, n) of op(B), k in [k0, k0 + kc), as panels of kCols columns: panel p holds columns
// p * kCols.. as [kc][kCols], columns past n zero.
MOE_TARGET_AVX512 void pack_b(const GemmProblem& p, const float* b, int64_t n, int64_t k0,
                              int64_t kc, float* out) {
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    const int64_t cols = std::min(kCols, n - j0);
    float* panel = out + j0 * kc;
    if (!p.transpose_b) {  // B is [K, N]: a panel's row of k is contiguous
      __mmask16 mask[kVectors];
      for (int64_t v = 0; v < kVectors; ++v) mask[v] = lanes(cols - 16 * v);
      for (int64_t k = 0; k < kc; ++k) {
        const float* src = b + (k0 + k) * p.ldb + j0;
        float* dst = panel + k * kCols;
        for (int64_t v = 0; v < kVectors; ++v)
          _mm512_store_ps(dst + 16 * v, _mm512_maskz_loadu_ps(mask[v], src + 16 * v));
      }
    } else {  // B is [N, K]: 16 columns of op(B) by 16 k at a time, transposed
      __m512 rows[16];
      for (int64_t v = 0; v < kVectors; ++v) {
        const int64_t count = std::max<int64_t>(0, std::min<int64_t>(16, cols - 16 * v));
        for (int64_t k = 0; k < kc; k += 16) {
          const int64_t depth = std::min<int64_t>(16, kc - k);
          transpose_16x16(b + (j0 + 16 * v) * p.ldb + k0 + k, p.ldb, count, depth, rows);
          for (int64_t c = 0; c < depth; ++c)
            _mm512_store_ps(panel + (k + c) * kCols + 16 * v, rows[c]);
        }
      }
    }
  }
}

// Where a block of C goes when the last k block is done.
struct Epilogue {
  float* c;
  int64_t ldc, rows, cols;  // the valid part of the kRows x kCols block
  float alpha, beta;
};

// The first kR rows of a kRows x kCols block of C over one k block (kR < kRows for the last row
// panel of a tile, so that a ragged edge does not multiply a whole panel of padding; the rows
// are the same FMA chains whichever kR computes them). `sums` holds the sums of the k blocks so
// far ([kRows][kCols]): the block's own chains start from zero and are added to them (not for the
// first block); the last block writes C.
template <int64_t kR, bool kFirst, bool kLast>
MOE_TARGET_AVX512 void micro_kernel(const float* __restrict a, const float* __restrict b,
                                    int64_t kc, float* __restrict sums, const Epilogue& e) {
  __m512 acc[kR][kVectors];
#pragma GCC unroll 16
  for (int64_t r = 0; r < kR; ++r)
#pragma GCC unroll 4
    for (int64_t v = 0; v < kVectors; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    __m512 bv[kVectors];
#pragma GCC unroll 4
    for (int64_t v = 0; v < kVectors; ++v) bv[v] = _mm512_load_ps(b + 16 * v);
#pragma GCC unroll 16
    for (int64_t r = 0; r < kR; ++r) {
      const __m512 av = _mm512_set1_ps(a[r]);
#pragma GCC unroll 4
      for (int64_t v = 0; v < kVectors; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
    a += kRows;
    b += kCols;
  }
  if constexpr (!kFirst) {
#pragma GCC unroll 16
    for (int64_t r = 0; r < kR; ++r)
#pragma GCC unroll 4
      for (int64_t v = 0; v < kVectors; ++v)
        acc[r][v] = _mm512_add_ps(_mm512_load_ps(sums + r * kCols + 16 * v), acc[r][v]);
  }
  if constexpr (!kLast) {
#pragma GCC unroll 16
    for (int64_t r = 0; r < kR; ++r)
#pragma GCC unroll 4
      for (int64_t v = 0; v < kVectors; ++v) _mm512_store_ps(sums + r * kCols + 16 * v, acc[r][v]);
  } else {
    const __m512 alpha = _mm512_set1_ps(e.alpha), beta = _mm512_set1_ps(e.beta);
    __mmask16 mask[kVectors];
#pragma GCC unroll 4
    for (int64_t v = 0; v < kVectors; ++v) mask[v] = lanes(e.cols - 16 * v);
#pragma GCC unroll 16
    for (int64_t r = 0; r < kR; ++r) {
      if (r >= e.rows) break;
      float* c = e.c + r * e.ldc;
#pragma GCC unroll 4
      for (int64_t v = 0; v < kVectors; ++v) {
        __m512 out = _mm512_mul_ps(alpha, acc[r][v]);
        // beta == 0 never reads C (BLAS semantics: C may hold NaN).
        if (e.beta != 0.0f)
          out = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mask[v], c + 16 * v), out);
        _mm512_mask_storeu_ps(c + 16 * v, mask[v], out);
      }
    }
  }
}

using MicroKernel = void (*)(const float*, const float*, int64_t, float*, const Epilogue&);

template <int64_t kR>
MicroKernel micro_kernel_for(bool first, bool last) {
  return first ? (last ? micro_kernel<kR, true, true> : micro_kernel<kR, true, false>)
               : (last ? micro_kernel<kR, false, true> : micro_kernel<kR, false, false>);
}

// The kernel for a panel of `rows` (<= kRows) rows: the smallest of 4, 7, 10, 14 rows that
// covers them (under 4 rows, fewer than 8 FMA chains would not fill two FMA pipes anyway).
MicroKernel micro_kernel_for_rows(int64_t rows, bool first, bool last) {
  if (rows <= 4) return micro_kernel_for<4>(first, last);
  if (rows <= 7) return micro_kernel_for<7>(first, last);
  if (rows <= 10) return micro_kernel_for<10>(first, last);
  return micro_kernel_for<kRows>(first, last);
}

}  // namespace

int64_t gemm_avx512_k_block(int64_t k) {
  const int64_t blocks = ceil_div(std::max<int64_t>(k, 1), kMaxKc);
  return ceil_div(std::max<int64_t>(k, 1), blocks);  // even blocks
}

bool gemm_avx512_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

MOE_TARGET_AVX512 void sgemm_tile_avx512(const GemmProblem& p, int64_t m, int64_t n, const float* a,
                                         const float* b, float* c, uint64_t call) {
  const int64_t row_panels = ceil_div(m, kRows), col_panels = ceil_div(n, kCols);
  const int64_t kc_max = gemm_avx512_k_block(p.k), blocks = ceil_div(p.k, kc_max);
  const int64_t a_block = row_panels * kRows * kc_max, b_block = col_panels * kCols * kc_max;
  Workspace& w = t_workspace;
  // Kept panels: every k block in its own slot, reused when this thread's previous tile of the
  // same call packed the same operand part (the key); otherwise one slot, packed block by block.
  const bool keep_a = call != 0 && a_block * blocks <= kKeepFloats;
  const bool keep_b = call != 0 && b_block * blocks <= kKeepFloats;
  const PackedKey a_key{a, m, p.k, p.lda, p.transpose_a, call};
  const PackedKey b_key{b, n, p.k, p.ldb, p.transpose_b, call};
  const bool a_ready = keep_a && w.a_key == a_key, b_ready = keep_b && w.b_key == b_key;
  float* a_packed = w.a.get(keep_a ? a_block * blocks : a_block);
  float* b_packed = w.b.get(keep_b ? b_block * blocks : b_block);
  w.a_key = keep_a ? a_key : PackedKey{};
  w.b_key = keep_b ? b_key : PackedKey{};
  float* sums = blocks > 1 ? w.sums.get(row_panels * col_panels * kRows * kCols) : nullptr;
  constexpr int64_t kBlock = kRows * kCols;
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t k0 = block * kc_max, kc = std::min(kc_max, p.k - k0);
    float* const a_slot = a_packed + (keep_a ? block * a_block : 0);
    float* const b_slot = b_packed + (keep_b ? block * b_block : 0);
    if (!a_ready) pack_a(p, a, m, k0, kc, a_slot);
    if (!b_ready) pack_b(p, b, n, k0, kc, b_slot);
    const bool first = block == 0, last = block == blocks - 1;
    const MicroKernel full = micro_kernel_for_rows(kRows, first, last);
    const MicroKernel edge = micro_kernel_for_rows(m - (row_panels - 1) * kRows, first, last);
    // A column panel of B (32 KiB) stays in L1 while every row panel of A passes over it.
    for (int64_t jp = 0; jp < col_panels; ++jp)
      for (int64_t ip = 0; ip < row_panels; ++ip) {
        const int64_t i0 = ip * kRows, j0 = jp * kCols;
        const Epilogue e{c + i0 * p.ldc + j0,     p.ldc,   std::min(kRows, m - i0),
                         std::min(kCols, n - j0), p.alpha, p.beta};
        (ip + 1 < row_panels ? full : edge)(a_slot + i0 * kc, b_slot + j0 * kc, kc,
                                            sums ? sums + (ip * col_panels + jp) * kBlock : nullptr,
                                            e);
      }
  }
}

#else  // not x86-64 with GCC or Clang: no AVX-512 kernel

bool gemm_avx512_supported() { return false; }
int64_t gemm_avx512_k_block(int64_t k) { return k; }
void sgemm_tile_avx512(const GemmProblem&, int64_t, int64_t, const float*, const float*, float*,
                       uint64_t) {
  throw Error("cpu sgemm: the avx512 kernel is not built for this CPU architecture");
}

#endif

uint64_t gemm_next_call() {
  static std::atomic<uint64_t> calls{0};
  return calls.fetch_add(1, std::memory_order_relaxed) + 1;
}

}  // namespace moe::cpu
