// CPU grouped expert GEMM (operand checks in ops/grouped_gemm.cpp): one sgemm per non-empty expert
// segment on the contiguous rows of the permuted buffer (no padding, no copies), plus the per-row
// bias / activation loops of the experts. Shapes: M rows of the permuted buffer, D model width, F
// expert hidden width, E experts; offsets [E+1] delimit the segments. The segments' GEMMs go to
// cpu::sgemm_batch (tiles fixed by each segment's shape, one parallel loop over all of them); the
// row loops are OpenMP over rows and bias gradients sum rows in order: results do not depend on the
// thread count.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "backend/cpu/activation_rows.h"
#include "backend/cpu/backend.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemv.h"
#include "core/parallel.h"
#include "kernels/experts.h"

namespace moe::cpu {
namespace {

// The expert whose segment holds `row` (offsets are sorted; empty segments are skipped).
inline int64_t expert_of_row(const std::vector<int32_t>& offsets, int64_t row) {
  auto it = std::upper_bound(offsets.begin(), offsets.end(), static_cast<int32_t>(row));
  return static_cast<int64_t>(it - offsets.begin()) - 1;
}

}  // namespace

void grouped_gemm(const Tensor& a, const Tensor& w, bool transpose_w,
                  const std::vector<int32_t>& offsets, Tensor& c, float beta) {
  const int64_t experts = w.dim(0), r = w.dim(1), s = w.dim(2);
  // k from A: a Q8_0 weight's last dimension counts bytes, not elements.
  const int64_t k = a.dim(1), n = transpose_w ? r : s;
  const float* as = a.data<float>();
  float* cs = c.data<float>();
  if (transpose_w) {  // forward: x W_e^T; W may be 16-bit (inference)
    // Segments of a few rows (decode) go to the GEMV, all in one parallel loop over their output
    // rows (a token's k experts share the threads); the others widen their expert once into a
    // reused scratch and run the tiled sgemm, all their tiles in one loop, a group of experts of
    // at most kWidenedFloats widened floats at a time (or one expert bigger than that; f32 experts
    // are not copied: one group).
    // The lists are reused.
    thread_local std::vector<GemvProblem> narrow;
    thread_local std::vector<GemmProblem> wide;
    narrow.clear();
    wide.clear();
    const bool copies = experts > 0 && weight_matrix(w, 0, k).format != WeightFormat::f32;
    int64_t group_floats = 0;
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t begin = offsets[e], m = offsets[e + 1] - begin;
      if (m == 0) continue;
      const WeightMatrix we = weight_matrix(w, e, k);
      if (gemv_applies(m)) {
        narrow.push_back({we, as + begin * k, k, m, cs + begin * n, n, beta});
        continue;
      }
      if (copies && !wide.empty() && group_floats + n * k > kWidenedFloats) {
        sgemm_batch(wide.data(), wide.size());
        wide.clear();
        group_floats = 0;
      }
      group_floats += n * k;
      wide.push_back({false, true, m, n, k, 1.0f, as + begin * k, k,
                      widened(we, static_cast<int64_t>(wide.size())), k, beta, cs + begin * n, n});
    }
    if (!narrow.empty()) gemv_batch(narrow.data(), narrow.size());
    if (!wide.empty()) sgemm_batch(wide.data(), wide.size());
    return;
  }
  const float* ws = w.data<float>();
  // One GEMM per non-empty segment, all their tiles in one parallel loop.
  std::vector<GemmProblem> problems;
  problems.reserve(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = offsets[e], m = offsets[e + 1] - begin;
    if (m == 0) continue;
    problems.push_back({false, transpose_w, m, n, k, 1.0f, as + begin * k, k, ws + e * r * s, s,
                        beta, cs + begin * n, n});
  }
  sgemm_batch(problems.data(), problems.size());
}

void grouped_gemm_weight_grad(const Tensor& dy, const Tensor& x,
                              const std::vector<int32_t>& offsets, Tensor& dw) {
  const int64_t experts = dw.dim(0), r = dw.dim(1), s = dw.dim(2);
  const float* dys = dy.data<float>();
  const float* xs = x.data<float>();
  float* dws = dw.data<float>();
  std::vector<GemmProblem> problems;
  problems.reserve(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = offsets[e], m = offsets[e + 1] - begin;
    if (m == 0) continue;
    problems.push_back({true, false, r, s, m, 1.0f, dys + begin * r, r, xs + begin * s, s, 1.0f,
                        dws + e * r * s, s});
  }
  sgemm_batch(problems.data(), problems.size());
}

void expert_activation(Tensor& h, const Tensor& h3, const Tensor& bias,
                       const std::vector<int32_t>& offsets, Activation activation,
                       SwigluClamp clamp, Tensor& a) {
  const int64_t rows = h.dim(0), width = h.dim(1);
  const float* bs = bias.defined() ? bias.data<float>() : nullptr;
  float* hs = h.data<float>();
  float* as = a.data<float>();
  if (activation == Activation::gelu) {
#pragma omp parallel for schedule(static) if (rows * width >= kParallelWork)
    for (int64_t i = 0; i < rows; ++i)
      bias_gelu_span(hs + i * width, bs ? bs + expert_of_row(offsets, i) * width : nullptr,
                     hs + i * width, as + i * width, width);
  } else if (activation == Activation::swiglu_clamped) {
    const float* h3s = h3.data<float>();
#pragma omp parallel for schedule(static) if (rows * width >= kParallelWork)
    for (int64_t i = 0; i < rows; ++i)
      bias_clamped_swiglu_span(hs + i * width, h3s + i * width,
                               bs ? bs + expert_of_row(offsets, i) * width : nullptr, clamp,
                               hs + i * width, as + i * width, width);
  } else {
    const float* h3s = h3.data<float>();
#pragma omp parallel for schedule(static) if (rows * width >= kParallelWork)
    for (int64_t i = 0; i < rows; ++i)
      bias_swiglu_span(hs + i * width, h3s + i * width,
                       bs ? bs + expert_of_row(offsets, i) * width : nullptr, hs + i * width,
                       as + i * width, width);
  }
}

void expert_activation_backward(const Tensor& da, const Tensor& h, const Tensor& h3,
                                Activation activation, SwigluClamp clamp, Tensor& dh,
                                Tensor& dh3) {
  const int64_t rows = da.dim(0), width = da.dim(1);
  const float* das = da.data<float>();
  const float* hs = h.data<float>();
  float* dhs = dh.data<float>();
  if (activation == Activation::gelu) {
#pragma omp parallel for schedule(static) if (rows * width >= kParallelWork)
    for (int64_t i = 0; i < rows; ++i)
      gelu_backward_span(hs + i * width, das + i * width, dhs + i * width, width);
  } else if (activation == Activation::swiglu_clamped) {
    const float* h3s = h3.data<float>();
    float* dh3s = dh3.data<float>();
#pragma omp parallel for schedule(static) if (rows * width >= kParallelWork)
    for (int64_t i = 0; i < rows; ++i)
      clamped_swiglu_backward_span(hs + i * width, h3s + i * width, das + i * width, clamp,
                                   dhs + i * width, dh3s + i * width, width);
  } else {
    const float* h3s = h3.data<float>();
    float* dh3s = dh3.data<float>();
#pragma omp parallel for schedule(static) if (rows * width >= kParallelWork)
    for (int64_t i = 0; i < rows; ++i)
      swiglu_backward_span(hs + i * width, h3s + i * width, das + i * width, dhs + i * width,
                           dh3s + i * width, width);
  }
}

void grouped_add_bias(Tensor& y, const Tensor& bias, const std::vector<int32_t>& offsets) {
  const int64_t rows = y.dim(0), width = y.dim(1);
  const float* bs = bias.data<float>();
  float* ys = y.data<float>();
#pragma omp parallel for schedule(static) if (rows * width >= kParallelWork)
  for (int64_t i = 0; i < rows; ++i)
    kernels::add_row(ys + i * width, bs + expert_of_row(offsets, i) * width, width);
}

void grouped_bias_grad(const Tensor& dy, const std::vector<int32_t>& offsets, Tensor& dbias) {
  const int64_t rows = dy.dim(0), width = dy.dim(1);
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1;
  // Each (expert, block of columns) is summed by one thread over the segment's rows in order.
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (width + kBlock - 1) / kBlock;
  const float* dys = dy.data<float>();
  float* dbs = dbias.data<float>();
#pragma omp parallel for collapse(2) schedule(static) if (rows * width >= kParallelWork)
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * kBlock, len = std::min(kBlock, width - c0);
      float acc[kBlock] = {};
      for (int64_t i = offsets[e]; i < offsets[e + 1]; ++i)
        kernels::add_row(acc, dys + i * width + c0, len);
      kernels::add_row(dbs + e * width + c0, acc, len);
    }
  }
}

}  // namespace moe::cpu
