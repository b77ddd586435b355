// Decode GEMV over f32 / bf16 / f16 / Q8_0 weights (see gemv.h): a scalar path and an AVX-512
// path (F, BW, VL; picked at run time, the library targets baseline x86-64) with the same lanes,
// the same fused multiply-adds and the same final tree, so both give the same bits. Block-format
// weights (q4_k, q6_k, mxfp4) take gemv_blocks.cpp's rows; the task split here is shared.
// Shapes: m input rows, out x in weights, 16 lanes.
#include "backend/cpu/gemv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/gemv_blocks.h"
#include "backend/cpu/gemv_internal.h"
#include "backend/cpu/gemv_q8.h"
#include "backend/cpu/task_pool.h"
#include "backend/cpu/vector_isa.h"
#include "core/parallel.h"
#include "kernels/convert.h"
#include "moe/error.h"
#include "moe/tensor.h"

namespace moe::cpu {
using namespace gemv_detail;
namespace {

// Element j of row o widened to f32 (exact). The float formats only: a Q8_0 product runs
// q8_rows_* (gemv_q8.cpp) on its quantised inputs, never the f32-input rows below.
inline float weight_at(const WeightMatrix& w, int64_t o, int64_t j) {
  const int64_t at = o * w.in + j;
  switch (w.format) {
    case WeightFormat::f32:
      return static_cast<const float*>(w.data)[at];
    case WeightFormat::bf16:
      return kernels::bf16_to_f32(static_cast<const uint16_t*>(w.data)[at]);
    case WeightFormat::f16:
      return kernels::f16_to_f32(static_cast<const uint16_t*>(w.data)[at]);
    case WeightFormat::q8_0:  // never here: Q8_0 products take the 8-bit-input kernels
    case WeightFormat::q4_k:  // nor blocks (gemv_blocks.cpp)
    case WeightFormat::q6_k:
    case WeightFormat::mxfp4:
      break;
  }
  return 0.0f;
}

void rows_scalar(const GemvProblem& p, int64_t begin, int64_t end) {
  const int64_t in = p.w.in;
  for (int64_t o = begin; o < end; ++o) {
    float lanes[kGemvMaxRows][kLanes] = {};
    for (int64_t j0 = 0; j0 < in; j0 += kLanes) {
      const int64_t n = std::min(kLanes, in - j0);
      for (int64_t l = 0; l < n; ++l) {
        const float wv = weight_at(p.w, o, j0 + l);
        for (int64_t i = 0; i < p.m; ++i)
          lanes[i][l] = std::fma(wv, p.x[i * p.ldx + j0 + l], lanes[i][l]);
      }
    }
    for (int64_t i = 0; i < p.m; ++i) store_output(p, i, o, reduce_lanes(lanes[i]));
  }
}

#if MOE_GEMV_X86
// GCC 12 reports its own _mm512_undefined_epi32() inside the conversion intrinsics as maybe
// uninitialised (a false positive: every lane is written).
#if defined(__GNUC__) && !defined(__clang__)  // clang has no such warning (nor the false report)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// 16 weights of row `row` from element j (n <= 16 valid, the rest zero) widened to f32.
template <WeightFormat F>
MOE_TARGET_GEMV512 inline __m512 load_weights(const WeightMatrix& w, int64_t o, int64_t j,
                                              __mmask16 mask) {
  const int64_t at = o * w.in + j;
  if constexpr (F == WeightFormat::f32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(w.data) + at);
  } else if constexpr (F == WeightFormat::bf16) {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(w.data) + at);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (F == WeightFormat::f16) {
    return _mm512_cvtph_ps(
        _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(w.data) + at));
  } else {  // never here: Q8_0 widens by pairs (widen_q8_group_avx512), multiplies in gemv_q8
    return _mm512_setzero_ps();
  }
}

// Where element j of row o starts in memory (the float formats).
template <WeightFormat F>
inline const char* weight_address(const WeightMatrix& w, int64_t o, int64_t j) {
  static_assert(F != WeightFormat::q8_0, "Q8_0 rows run the 8-bit-input kernels (gemv_q8.cpp)");
  constexpr int64_t bytes = F == WeightFormat::f32 ? 4 : 2;
  return static_cast<const char*>(w.data) + (o * w.in + j) * bytes;
}

// R weight rows side by side against the M input rows, then the next R rows; each output
// element sums its lanes in the one order of the scalar path, whatever R. R x M accumulator
// chains hide the FMA latency, and R streams keep reads in flight. The rows of a task are back
// to back in memory: f32 reads them one after the other (R 1), one sequential stream, which
// read about 1.2x the rate of 8 rows side by side (moe-bench --decode, 2026-11-26), and so do
// 16-bit rows against one input row (f16's GEMV alone 1.1-1.3x, bf16's level, once the task pool
// gave each thread a contiguous range, 2026-11-27; before it, 0.9x). 16-bit rows go 8 side by
// side against 2 input rows (R 1 there read batch-8 decode 0.95-1.0x as fast) and 2 side by side
// against 3-4.
template <WeightFormat F, int M, int R>
MOE_TARGET_GEMV512 void rows_avx512_block(const GemvProblem& p, int64_t o) {
  const int64_t in = p.w.in, full = in / kLanes * kLanes;
  const __mmask16 tail = static_cast<__mmask16>((1u << (in - full)) - 1u);
  // Elements per 64-byte line: 16-bit rows span a line every 2 steps of kLanes.
  constexpr int64_t kLine = F == WeightFormat::f32 ? 16 : 32;
  // The rows kAhead ahead (the next block's, at least 4 rows on), at the same column, are asked
  // for while these compute: a row is only a few KB, and the prefetcher alone ramps up too late
  // on each task's rows.
  constexpr int64_t kAhead = R == 1 ? 4 : R;
  __m512 acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i) acc[r][i] = _mm512_setzero_ps();
  for (int64_t j = 0; j < full; j += kLanes) {
    __m512 xv[M];
    for (int i = 0; i < M; ++i) xv[i] = _mm512_loadu_ps(p.x + i * p.ldx + j);
    for (int r = 0; r < R; ++r) {
      if (j % kLine == 0 && o + kAhead + r < p.w.out)
        _mm_prefetch(weight_address<F>(p.w, o + kAhead + r, j), _MM_HINT_T0);
      const __m512 wv = load_weights<F>(p.w, o + r, j, 0xffff);
      for (int i = 0; i < M; ++i) acc[r][i] = _mm512_fmadd_ps(wv, xv[i], acc[r][i]);
    }
  }
  if (tail) {
    __m512 xv[M];
    for (int i = 0; i < M; ++i) xv[i] = _mm512_maskz_loadu_ps(tail, p.x + i * p.ldx + full);
    for (int r = 0; r < R; ++r) {
      const __m512 wv = load_weights<F>(p.w, o + r, full, tail);
      for (int i = 0; i < M; ++i) acc[r][i] = _mm512_fmadd_ps(wv, xv[i], acc[r][i]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i) {
      alignas(64) float lane[kLanes];
      _mm512_store_ps(lane, acc[r][i]);
      store_output(p, i, o + r, reduce_lanes(lane));
    }
}

template <WeightFormat F, int M>
void rows_avx512_m(const GemvProblem& p, int64_t begin, int64_t end) {
  constexpr int R = F == WeightFormat::f32 || M == 1 ? 1 : M <= 2 ? 8 : M <= 4 ? 2 : 1;
  int64_t o = begin;
  for (; o + R <= end; o += R) rows_avx512_block<F, M, R>(p, o);
  for (; o < end; ++o) rows_avx512_block<F, M, 1>(p, o);
}

template <WeightFormat F>
void rows_avx512_f(const GemvProblem& p, int64_t begin, int64_t end) {
  with_rows(p.m, [&](auto m) { rows_avx512_m<F, decltype(m)::value>(p, begin, end); });
}

// Calls fn with the format as a compile-time constant (std::integral_constant).
template <class Fn>
void with_format(WeightFormat format, Fn&& fn) {
  switch (format) {
    case WeightFormat::f32:
      return fn(std::integral_constant<WeightFormat, WeightFormat::f32>{});
    case WeightFormat::bf16:
      return fn(std::integral_constant<WeightFormat, WeightFormat::bf16>{});
    case WeightFormat::f16:
      return fn(std::integral_constant<WeightFormat, WeightFormat::f16>{});
    case WeightFormat::q8_0:
      return fn(std::integral_constant<WeightFormat, WeightFormat::q8_0>{});
    case WeightFormat::q4_k:  // never here: block rows widen through dequantize_row
    case WeightFormat::q6_k:
    case WeightFormat::mxfp4:
      return;
  }
}

// The float formats' rows (a Q8_0 task runs q8_rows_avx512 on its quantised inputs instead).
void rows_avx512(const GemvProblem& p, int64_t begin, int64_t end) {
  switch (p.w.format) {
    case WeightFormat::f32:
      return rows_avx512_f<WeightFormat::f32>(p, begin, end);
    case WeightFormat::bf16:
      return rows_avx512_f<WeightFormat::bf16>(p, begin, end);
    case WeightFormat::f16:
      return rows_avx512_f<WeightFormat::f16>(p, begin, end);
    case WeightFormat::q8_0:  // never here
    case WeightFormat::q4_k:
    case WeightFormat::q6_k:
    case WeightFormat::mxfp4:
      return;
  }
}

// Row o of w widened to f32 into dst (prefill's scratch): the kernel's own loads, 16 at a time.
// Q8_0 rows [begin, end) of one row group, widened pair by pair (the group's bytes in order), 16
// values of a block at a time times the block's scale, into dst [end - begin, in].
MOE_TARGET_GEMV512 void widen_q8_group_avx512(const WeightMatrix& w, int64_t begin, int64_t end,
                                              float* dst) {
  for (int64_t t = 0; t < q8_pairs(w.in); ++t)
    for (int64_t o = begin; o < end; ++o) {
      const Q8Pair pair = q8_pair(w, o, t);
      for (int64_t c = 0, j = 2 * kQ8Block * t; c < 4 && j < w.in; ++c, j += kLanes) {
        const int64_t n = std::min(kLanes, w.in - j);
        const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1u);
        const __m128i q = _mm_maskz_loadu_epi8(mask, pair.values + c * kLanes);
        uint16_t h;
        std::memcpy(&h, pair.scales + 2 * (c / 2), sizeof h);
        const float scale = _cvtsh_ss(h);  // one vcvtph2ps; the same (exact) value as f16_to_f32
        _mm512_mask_storeu_ps(
            dst + (o - begin) * w.in + j, mask,
            _mm512_mul_ps(_mm512_set1_ps(scale), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))));
      }
    }
}

template <WeightFormat F>
MOE_TARGET_GEMV512 void widen_row_avx512_f(const WeightMatrix& w, int64_t o, float* dst) {
  if constexpr (F == WeightFormat::q8_0) {
    widen_q8_group_avx512(w, o, o + 1, dst);  // widen_rows takes whole groups instead
  } else {
    for (int64_t j = 0; j < w.in; j += kLanes) {
      const int64_t n = std::min(kLanes, w.in - j);
      const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1u);
      _mm512_mask_storeu_ps(dst + j, mask, load_weights<F>(w, o, j, mask));
    }
  }
}

void widen_row_avx512(const WeightMatrix& w, int64_t o, float* dst) {
  with_format(w.format, [&](auto f) { widen_row_avx512_f<decltype(f)::value>(w, o, dst); });
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

}  // namespace

namespace gemv_detail {
bool avx512_available() {
  // The backend's AVX-512 set (F, BW, VL, AVX2, FMA). F16C is not asked for: clang's
  // __builtin_cpu_supports does not know it, and every CPU with AVX-512 has it (AVX-512F itself
  // brings the 512-bit vcvtph2ps).
  static const bool ok = vector_isa_supported(VectorIsa::avx512);
  return ok;
}

bool avx512_vnni_available() {
#if MOE_GEMV_X86
  static const bool ok = avx512_available() && __builtin_cpu_supports("avx512vnni");
  return ok;
#else
  return false;
#endif
}
}  // namespace gemv_detail

namespace {
struct Task {
  const GemvProblem* problem;
  const Q8Input* q8;         // Q8_0 weights: the problem's quantised input rows
  const BlockInput* blocks;  // block-format weights: the rows in the partner format
  int64_t begin, end;
};

}  // namespace

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::f32:
      return "f32";
    case WeightFormat::bf16:
      return "bf16";
    case WeightFormat::f16:
      return "f16";
    case WeightFormat::q8_0:
      return "q8_0";
    case WeightFormat::q4_k:
      return "q4_k";
    case WeightFormat::q6_k:
      return "q6_k";
    case WeightFormat::mxfp4:
      return "mxfp4";
  }
  return "?";
}

bool is_block_format(WeightFormat format) {
  return format == WeightFormat::q4_k || format == WeightFormat::q6_k ||
         format == WeightFormat::mxfp4;
}

BlockFormat block_format(WeightFormat format) {
  switch (format) {
    case WeightFormat::q4_k:
      return BlockFormat::q4_k;
    case WeightFormat::q6_k:
      return BlockFormat::q6_k;
    case WeightFormat::mxfp4:
      return BlockFormat::mxfp4;
    default:
      break;
  }
  throw Error(str("gemv: ", weight_format_name(format), " weights are not in a block format"));
}

bool gemv_isa_supported(GemvIsa isa) {
  switch (isa) {
    case GemvIsa::avx512_vnni:
      return avx512_vnni_available();
    case GemvIsa::avx512:
      return avx512_available();
    case GemvIsa::avx2:
      return vector_isa_supported(VectorIsa::avx2);
    default:
      return true;
  }
}

void gemv_batch(const GemvProblem* problems, size_t count, GemvIsa isa) {
  if (isa == GemvIsa::best)
    isa = avx512_vnni_available()                 ? GemvIsa::avx512_vnni
          : avx512_available()                    ? GemvIsa::avx512
          : vector_isa_supported(VectorIsa::avx2) ? GemvIsa::avx2
                                                  : GemvIsa::scalar;
  MOE_CHECK(gemv_isa_supported(isa), "gemv: this CPU lacks the instruction set the path needs");
  // The task list and the quantised input rows are reused between calls (decode steps allocate
  // nothing here once warm). Problems of a batch that share their input rows (an expert's w1
  // and w3, attention's q, k and v) share one quantisation of them.
  // avx2 has copies for the block formats only (gemv.h): the other formats run scalar under it.
  const bool wide = isa == GemvIsa::avx512 || isa == GemvIsa::avx512_vnni;
  thread_local std::vector<Task> tasks;
  thread_local std::vector<Q8Input> inputs;
  thread_local std::vector<BlockInput> block_inputs;
  thread_local std::vector<size_t> input_of;  // problem -> its entry of `inputs` or `block_inputs`
  tasks.clear();
  input_of.assign(count, 0);
  size_t quantised = 0, block_quantised = 0;
  double work = 0;
  for (size_t p = 0; p < count; ++p) {
    const GemvProblem& pr = problems[p];
    MOE_CHECK(pr.m >= 1 && pr.m <= kGemvMaxRows, "gemv: ", pr.m, " input rows (1 to ", kGemvMaxRows,
              ")");
    if (pr.w.format == WeightFormat::q8_0) {
      size_t k = 0;
      while (k < quantised && !inputs[k].holds(pr.x, pr.ldx, pr.m, pr.w.in)) ++k;
      if (k == quantised) {
        if (inputs.size() <= k) inputs.resize(k + 1);
        inputs[k].build(pr.x, pr.ldx, pr.m, pr.w.in, wide);
        ++quantised;
      }
      input_of[p] = k;
    } else if (is_block_format(pr.w.format)) {
      const BlockFormat partner = dot_partner(block_format(pr.w.format));
      size_t k = 0;
      while (k < block_quantised && !block_inputs[k].holds(pr.x, pr.ldx, pr.m, pr.w.in, partner))
        ++k;
      if (k == block_quantised) {
        if (block_inputs.size() <= k) block_inputs.resize(k + 1);
        block_inputs[k].build(pr.x, pr.ldx, pr.m, pr.w.in, partner);
        ++block_quantised;
      }
      input_of[p] = k;
    }
    work += double(pr.w.out) * double(pr.w.in) * double(pr.m);
  }
  for (size_t p = 0; p < count; ++p) {  // pointers into `inputs` once it has stopped growing
    const GemvProblem& pr = problems[p];
    const Q8Input* q8 = pr.w.format == WeightFormat::q8_0 ? &inputs[input_of[p]] : nullptr;
    const BlockInput* blocks = is_block_format(pr.w.format) ? &block_inputs[input_of[p]] : nullptr;
    for (int64_t o = 0; o < pr.w.out; o += kRowsPerTask)
      tasks.push_back({&pr, q8, blocks, o, std::min(pr.w.out, o + kRowsPerTask)});
  }
  const int64_t n = static_cast<int64_t>(tasks.size());
  const Task* t = tasks.data();
  const bool vnni = isa == GemvIsa::avx512_vnni;
  const DotBlockRow dot = dot_block_row_for(isa);
  auto run = [t, wide, vnni, dot](int64_t i) {
    const Task& task = t[i];
    if (task.blocks) return block_rows(*task.problem, *task.blocks, task.begin, task.end, dot);
#if MOE_GEMV_X86
    if (wide && task.q8) return q8_rows_avx512(*task.problem, *task.q8, task.begin, task.end, vnni);
    if (wide) return rows_avx512(*task.problem, task.begin, task.end);
#endif
    (void)wide;
    (void)vnni;
    if (task.q8) return q8_rows_scalar(*task.problem, *task.q8, task.begin, task.end);
    rows_scalar(*task.problem, task.begin, task.end);
  };
  // The task pool, not an OpenMP loop: a decode step makes ~60 of these calls, each tens of
  // microseconds of work, and a late thread must not hold the others up (task_pool.h).
  run_tasks(n, work >= double(kParallelWork) ? num_threads() : 1, run);
}

void widen_rows(const WeightMatrix& w, int64_t row, int64_t rows, float* out) {
  // The format is chosen once per row and a Q8_0 scale once per block (prefill widens every
  // weight of a pass: a per-element switch made Q8_0 prefill 4x slower than f32's).
  // With AVX-512 the 16-bit and Q8_0 rows widen through the GEMV's own loads (vcvtph2ps for f16:
  // the scalar conversion made f16 prefill 0.65x of f32's); the values are the same, exactly.
  if (is_block_format(w.format)) return widen_block_rows(w, row, rows, out);
  const int64_t in = w.in;
  const bool wide = w.format != WeightFormat::f32 && avx512_available();
#if MOE_GEMV_X86
  if (wide && w.format == WeightFormat::q8_0 && rows > 0) {  // a row group at a time, in order
    const int64_t first = row / kQ8Group, last = (row + rows - 1) / kQ8Group;
#pragma omp parallel for schedule(static) if (rows * in >= kParallelWork)
    for (int64_t g = first; g <= last; ++g) {
      const int64_t begin = std::max(row, g * kQ8Group);
      widen_q8_group_avx512(w, begin, std::min(row + rows, (g + 1) * kQ8Group),
                            out + (begin - row) * in);
    }
    return;
  }
#endif
#pragma omp parallel for schedule(static) if (rows * in >= kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = row + r;
    float* dst = out + r * in;
#if MOE_GEMV_X86
    if (wide) {
      widen_row_avx512(w, o, dst);
      continue;
    }
#endif
    (void)wide;
    switch (w.format) {
      case WeightFormat::f32: {
        const float* src = static_cast<const float*>(w.data) + o * in;
        std::copy(src, src + in, dst);
        break;
      }
      case WeightFormat::bf16: {
        const uint16_t* src = static_cast<const uint16_t*>(w.data) + o * in;
        for (int64_t j = 0; j < in; ++j) dst[j] = kernels::bf16_to_f32(src[j]);
        break;
      }
      case WeightFormat::f16: {
        const uint16_t* src = static_cast<const uint16_t*>(w.data) + o * in;
        for (int64_t j = 0; j < in; ++j) dst[j] = kernels::f16_to_f32(src[j]);
        break;
      }
      case WeightFormat::q4_k:  // never here: widen_block_rows
      case WeightFormat::q6_k:
      case WeightFormat::mxfp4:
        break;
      case WeightFormat::q8_0:
        for (int64_t b = 0; b < q8_blocks(in); ++b) {
          const Q8Pair pair = q8_pair(w, o, b / 2);
          const float scale = f16_at(pair.scales + 2 * (b % 2));
          const int64_t end = std::min(in, (b + 1) * kQ8Block);
          for (int64_t j = b * kQ8Block; j < end; ++j)
            dst[j] = scale * static_cast<float>(static_cast<int8_t>(pair.values[j % 64]));
        }
        break;
    }
  }
}

float q8_scale(const uint8_t* row, int64_t n, int64_t b) { return f16_at(row + n + 2 * b); }

void dequantize_q8_0_row(const uint8_t* row, int64_t n, float* out) {
  for (int64_t j = 0; j < n; ++j)
    out[j] = q8_scale(row, n, j / kQ8Block) * static_cast<float>(static_cast<int8_t>(row[j]));
}

// pack_q8_0 and unpack_q8_0: each pair of each row copied from one layout to the other.
template <bool kPack>
void move_q8_0(const uint8_t* from, int64_t out, int64_t in, uint8_t* to) {
  const int64_t row_bytes = q8_row_bytes(in), blocks = q8_blocks(in);
  if (kPack) std::fill(to, to + out * q8_group_row_bytes(in), uint8_t{0});  // the padding
  for (int64_t o = 0; o < out; ++o)
    for (int64_t t = 0; t < q8_pairs(in); ++t) {
      const Q8PairOffsets g = q8_pair_offsets(out, in, o, t);
      const int64_t values = o * row_bytes + 2 * kQ8Block * t, scales = o * row_bytes + in + 4 * t;
      const auto n = static_cast<size_t>(std::min(2 * kQ8Block, in - 2 * kQ8Block * t));
      const size_t s = 2 * t + 1 < blocks ? 4 : 2;  // the pair's scale bytes (its last: 1 block)
      if (kPack) {
        std::memcpy(to + g.values, from + values, n);
        std::memcpy(to + g.scales, from + scales, s);
      } else {
        std::memcpy(to + values, from + g.values, n);
        std::memcpy(to + scales, from + g.scales, s);
      }
    }
}

void pack_q8_0(const uint8_t* rows, int64_t out, int64_t in, uint8_t* groups) {
  move_q8_0<true>(rows, out, in, groups);
}
void unpack_q8_0(const uint8_t* groups, int64_t out, int64_t in, uint8_t* rows) {
  move_q8_0<false>(groups, out, in, rows);
}

void quantize_q8_0_row(const float* x, int64_t n, uint8_t* row) {
  for (int64_t b = 0; b < q8_blocks(n); ++b) {
    const int64_t begin = b * kQ8Block, end = std::min(n, begin + kQ8Block);
    float amax = 0;
    for (int64_t j = begin; j < end; ++j) {
      MOE_CHECK(std::isfinite(x[j]), "q8_0: element ", j, " is not finite (", x[j], ")");
      amax = std::max(amax, std::fabs(x[j]));
    }
    // The stored (f16) scale is the one values are rounded against: dequantisation then errs by
    // at most half a step, scale / 2 (clamping at 127 errs less: the f16 rounding is 2^-11).
    const uint16_t bits = kernels::f32_to_f16(amax / 127.0f);
    const float scale = kernels::f16_to_f32(bits);
    MOE_CHECK(std::isfinite(scale), "q8_0: a block's largest magnitude ", amax,
              " exceeds what an f16 scale holds (", 65504.0f * 127.0f, ")");
    std::memcpy(row + n + 2 * b, &bits, sizeof bits);
    for (int64_t j = begin; j < end; ++j) row[j] = static_cast<uint8_t>(q8_quantize(x[j], scale));
  }
}

}  // namespace moe::cpu

// ---- glue (gemv.h) ----
namespace moe::cpu {
namespace {
bool gemv_enabled = true;

WeightFormat format_of(DType dtype, const Tensor& w) {
  switch (dtype) {
    case DType::f32:
      return WeightFormat::f32;
    case DType::bf16:
      return WeightFormat::bf16;
    case DType::f16:
      return WeightFormat::f16;
    case DType::q8_0:
      return WeightFormat::q8_0;
    case DType::q4_k:
      return WeightFormat::q4_k;
    case DType::q6_k:
      return WeightFormat::q6_k;
    case DType::mxfp4:
      return WeightFormat::mxfp4;
    default:
      break;
  }
  throw Error(str("gemm: weight ", w.describe(),
                  " is not f32, bf16, f16, Q8_0 row groups or q4_k / q6_k / mxfp4 rows"));
}

// The bytes of a row of `in` elements of a quantised weight's format.
int64_t quantized_row_bytes(WeightFormat format, int64_t in) {
  if (format == WeightFormat::q8_0) return q8_group_row_bytes(in);
  const BlockFormat f = block_format(format);
  return in > 0 && in % block_elems(f) == 0 ? block_row_bytes(f, in) : -1;
}
}  // namespace

WeightMatrix weight_matrix(const Tensor& w, int64_t index, int64_t in) {
  MOE_CHECK(w.ndim() >= 2, "gemm: weight ", w.describe(), " is not a matrix");
  WeightMatrix m;
  m.format = format_of(w.dtype(), w);
  m.out = w.dim(w.ndim() - 2);
  const int64_t row = w.dim(w.ndim() - 1);
  const bool quantized = m.format == WeightFormat::q8_0 || is_block_format(m.format);
  m.in = quantized ? in : row;
  MOE_CHECK(m.format != WeightFormat::q8_0 || (in > 0 && q8_group_row_bytes(in) == row),
            "gemm: Q8_0 weight ", w.describe(), " does not hold rows of ", in, " elements (",
            q8_group_row_bytes(in), " bytes each in row groups)");
  // (The message's arguments are evaluated only when the check fails: a block format then.)
  MOE_CHECK(!is_block_format(m.format) || quantized_row_bytes(m.format, in) == row,
            "gemm: ", weight_format_name(m.format), " weight ", w.describe(),
            " does not hold rows of ", in, " elements (its rows hold whole blocks of ",
            block_elems(block_format(m.format)), " elements, ", block_bytes(block_format(m.format)),
            " bytes each)");
  m.data = static_cast<const std::byte*>(w.raw()) +
           index * m.out * row * static_cast<int64_t>(dtype_size(w.dtype()));
  return m;
}

Tensor pack_q8_0(const Tensor& rows, int64_t in) {
  MOE_CHECK(rows.ndim() >= 2 && rows.dim(rows.ndim() - 1) == q8_row_bytes(in),
            "pack_q8_0: ", rows.describe(), " does not hold Q8_0 rows of ", in, " elements");
  const int64_t out = rows.dim(rows.ndim() - 2), matrices = rows.numel() / (out * q8_row_bytes(in));
  Shape shape = rows.shape();
  shape.back() = q8_group_row_bytes(in);
  Tensor groups = Tensor::empty(shape, DType::q8_0);
  for (int64_t m = 0; m < matrices; ++m)
    pack_q8_0(rows.data<uint8_t>() + m * out * q8_row_bytes(in), out, in,
              static_cast<uint8_t*>(groups.raw()) + m * out * shape.back());
  return groups;
}

Tensor block_rows(const Tensor& rows, BlockFormat format) {
  const DType dtype = dtype_of_block_format(format);
  MOE_CHECK(rows.dtype() == DType::u8 && rows.ndim() >= 2 && rows.dim(-1) > 0 &&
                rows.dim(-1) % block_bytes(format) == 0,
            "block_rows: ", rows.describe(), " does not hold ", block_format_name(format),
            " rows (u8, whole blocks of ", block_bytes(format), " bytes)");
  MOE_CHECK(rows.device().kind == Device::cpu, "block_rows: ", rows.describe(),
            " is not on the CPU (block-format weights are read by the CPU kernels)");
  Tensor t = Tensor::empty(rows.shape(), dtype);
  if (rows.nbytes() > 0) std::memcpy(t.raw(), rows.raw(), rows.nbytes());
  return t;
}

DType dtype_of_block_format(BlockFormat format) {
  switch (format) {
    case BlockFormat::q4_k:
      return DType::q4_k;
    case BlockFormat::q6_k:
      return DType::q6_k;
    case BlockFormat::mxfp4:
      return DType::mxfp4;
    default:
      break;
  }
  throw Error(str(block_format_name(format), " is an activation format, not a weight format"));
}

int64_t weight_row_elements(const Tensor& w, int64_t k) {
  const int64_t row = w.dim(-1);
  if (!is_quantized(w.dtype())) return row;
  return quantized_row_bytes(format_of(w.dtype(), w), k) == row ? k : row;
}

bool gemv_applies(int64_t m) { return gemv_enabled && m >= 1 && m <= kGemvMaxRows; }
void set_gemv_enabled(bool enabled) { gemv_enabled = enabled; }

const float* widened(const WeightMatrix& w, int64_t slot) {
  return widened_rows(w, 0, w.out, slot);
}

const float* widened_rows(const WeightMatrix& w, int64_t row, int64_t rows, int64_t slot) {
  if (w.format == WeightFormat::f32) return static_cast<const float*>(w.data) + row * w.in;
  thread_local std::vector<std::vector<float>> scratch;
  if (static_cast<int64_t>(scratch.size()) <= slot) scratch.resize(static_cast<size_t>(slot) + 1);
  std::vector<float>& s = scratch[static_cast<size_t>(slot)];
  if (static_cast<int64_t>(s.size()) < rows * w.in) s.resize(static_cast<size_t>(rows * w.in));
  widen_rows(w, row, rows, s.data());
  return s.data();
}

}  // namespace moe::cpu
