// The Q8_0 GEMV against 8-bit input rows (gemv.h): the input side and the row kernels.
// Not part of the library's interface.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cpu/gemv.h"
#include "backend/cpu/gemv_internal.h"

namespace moe::cpu::gemv_detail {

// m input rows of `in` elements quantised once per gemv_batch call (quantize_q8_input_row), laid
// out for the kernels: q [m][padded] (padded: `in` rounded up to a pair of blocks, zeros after
// `in`), scale [m][pairs * 16] with lane l of pair t holding block 2 t + l / 8's scale (0 for the
// block past the last of an odd count). Reused between calls (decode allocates once warm).
struct Q8Input {
  const float* x = nullptr;  // the source rows, as given (a batch's problems may share them)
  int64_t ldx = 0, m = 0, in = 0, padded = 0, pairs = 0;
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<float> block;  // one row's block scales, before they are spread over the lanes

  // wide: the AVX-512 quantiser (the same bytes as quantize_q8_input_row).
  void build(const float* rows, int64_t ld, int64_t count, int64_t n, bool wide);
  bool holds(const float* rows, int64_t ld, int64_t count, int64_t n) const {
    return x == rows && ldx == ld && m == count && in == n;
  }
  const int8_t* q_row(int64_t i) const { return q.data() + i * padded; }
  const float* scale_row(int64_t i) const { return scale.data() + i * pairs * 16; }
};

// quantize_q8_input_row, or its AVX-512 twin (wide; the same bytes and scales).
void quantize_input_row(const float* x, int64_t n, int8_t* q, float* scale, bool wide);

// Output rows [begin, end) of problem p (Q8_0 weights) against its quantised input rows x.
void q8_rows_scalar(const GemvProblem& p, const Q8Input& x, int64_t begin, int64_t end);
#if MOE_GEMV_X86
// The AVX-512 rows: with VNNI (only where the CPU has it) or without (gemv_q8_rows.h); the same
// bits either way.
void q8_rows_avx512(const GemvProblem& p, const Q8Input& x, int64_t begin, int64_t end, bool vnni);
void q8_rows_avx512_plain(const GemvProblem& p, const Q8Input& x, int64_t begin, int64_t end);
void q8_rows_avx512_vnni(const GemvProblem& p, const Q8Input& x, int64_t begin, int64_t end);
#endif

}  // namespace moe::cpu::gemv_detail
