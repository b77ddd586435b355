// Kernel bodies of causal attention, one score row at a time: the softmax over the keys a query
// sees and its backward. The products around them are GEMMs (BLAS on the CPU, cuBLAS on CUDA).
// A row holds `keys` scores; the query sees the first `visible` of them (causal mask).
//
// One order of operations everywhere: the row's sums (the exponentials' sum, the backward's dot
// product) run in kSoftmaxLanes lanes, lane l adding elements l, l + 16, ... in order, then the
// fixed tree of reduce_lanes (kernels/common.h, the GEMV's too); the exponential is
// kernels::exp_f, no libm call; products and sums are separate operations (the CPU builds these
// bodies with -ffp-contract=off, nvcc with --fmad=false). So the CPU's copies at every vector
// width (backend/cpu/activation_rows.h) and a GPU thread running the body give the same bits.
#pragma once
#include "kernels/activations.h"
#include "kernels/common.h"

namespace moe::kernels {

inline constexpr int64_t kSoftmaxLanes = kReduceLanes;

// Lane maximum, by reduce_lanes' tree (a maximum is exact in any order); lane is overwritten.
MOE_HD float softmax_lane_max(float* lane) {
  for (int64_t h = kSoftmaxLanes / 2; h >= 1; h /= 2)
    for (int64_t l = 0; l < h; ++l) lane[l] = lane[l + h] > lane[l] ? lane[l + h] : lane[l];
  return lane[0];
}

// p [keys]: softmax in place over p[0..visible), exact zeros after, with an attention sink
// (gpt-oss): a logit `sink` that joins the denominator and the maximum but brings no value, so
// p[j] = exp(s_j - m) / (exp(sink - m) + sum_i exp(s_i - m)), m = max(sink, max_i s_i), the row
// summing to 1 - exp(sink - m) / that denominator (the sink's share). sink = -inf (or any logit
// whose exponential underflows, below m - 104) is none: the maximum keeps its value, the sink's
// +0 leaves the sum as it was, and the row has causal_softmax_row's bits. The largest score is
// subtracted first. The row runs in whole blocks of 16; where the last, partial one ends inside
// the row (visible rounded up to 16 <= keys: most rows of a causal score matrix) it is read in
// place, a key past `visible` taken as -inf, whose exponential is +0: it leaves its lane's sum as
// it was and is the zero the row wants there. Otherwise (visible near keys) the partial block
// runs through a local block padded the same way. Either way the same operations reach every
// lane, so the bits do not depend on the row's length past `visible`.
MOE_HD void causal_softmax_sink_row(float* p, int64_t visible, int64_t keys, float sink) {
  constexpr int64_t L = kSoftmaxLanes;
  const int64_t whole = visible - visible % L;
  const bool in_place = whole + L <= keys;
  float tail[L], lane[L];
  if (in_place) {
    for (int64_t l = 0; l < L; ++l) tail[l] = whole + l < visible ? p[whole + l] : -INFINITY;
  } else {
    for (int64_t l = 0; l < L; ++l) tail[l] = -INFINITY;
    for (int64_t l = 0; whole + l < visible; ++l) tail[l] = p[whole + l];
  }
  for (int64_t l = 0; l < L; ++l) lane[l] = tail[l];
  for (int64_t j = 0; j < whole; j += L)
    for (int64_t l = 0; l < L; ++l) lane[l] = p[j + l] > lane[l] ? p[j + l] : lane[l];
  const float lane_max = softmax_lane_max(lane);
  const float m = sink > lane_max ? sink : lane_max;
  for (int64_t l = 0; l < L; ++l) lane[l] = 0.0f;
  for (int64_t j = 0; j < whole; j += L)
    for (int64_t l = 0; l < L; ++l) {
      const float e = exp_f(p[j + l] - m);
      p[j + l] = e;
      lane[l] += e;
    }
  for (int64_t l = 0; l < L; ++l) {
    tail[l] = exp_f(tail[l] - m);
    lane[l] += tail[l];
  }
  const float inv = 1.0f / (reduce_lanes(lane) + exp_f(sink - m));
  for (int64_t j = 0; j < whole; ++j) p[j] *= inv;
  if (in_place) {  // the block's keys past `visible` get 0 x inv = +0
    for (int64_t l = 0; l < L; ++l) p[whole + l] = tail[l] * inv;
    for (int64_t j = whole + L; j < keys; ++j) p[j] = 0.0f;
  } else {
    for (int64_t l = 0; whole + l < visible; ++l) p[whole + l] = tail[l] * inv;
    for (int64_t j = visible; j < keys; ++j) p[j] = 0.0f;
  }
}

// The softmax row without a sink.
MOE_HD void causal_softmax_row(float* p, int64_t visible, int64_t keys) {
  causal_softmax_sink_row(p, visible, keys, -INFINITY);
}

// Sliding-window attention, as transformers 5 masks it (masking_utils.sliding_window_overlay:
// key j is visible to query i when j > i - window, with the causal j <= i) and llama.cpp's
// standard SWA (p_query - p_key < n_swa): a query sees `window` keys, itself included; window 0
// means no window. The first key a query at `position` sees:
MOE_HD int64_t window_first_key(int64_t position, int64_t window) {
  return window > 0 && position >= window ? position - window + 1 : 0;
}

// The scores of the keys before `first` set to -inf ahead of causal_softmax_row: they then leave
// the row's maximum and sum as they were (their exponential is +0) and come out as exact zeros,
// so the backward (causal_softmax_backward_row, which reads only the probabilities and writes
// p (d - dot) = 0 there) and every product after it need no mask of their own. With first 0 the
// row is untouched: a model without a window keeps its bits.
MOE_HD void mask_before_window(float* p, int64_t first) {
  for (int64_t j = 0; j < first; ++j) p[j] = -INFINITY;
}

// d [keys] holds d loss / d probs of the row (dctx V^T); replaced by d loss / d scores before the
// scale: scale * p[j] (d[j] - sum_i p[i] d[i]) over the visible keys, zeros after. The dot
// product's partial last block adds +0 products past `visible` (read in place where the block
// ends inside the row, the product replaced by 0 whatever d holds there; else from local blocks
// of zeros), which leave a lane as it was.
MOE_HD void causal_softmax_backward_row(const float* p, float* d, int64_t visible, int64_t keys,
                                        float scale) {
  constexpr int64_t L = kSoftmaxLanes;
  const int64_t whole = visible - visible % L;
  float lane[L];
  for (int64_t l = 0; l < L; ++l) lane[l] = 0.0f;
  for (int64_t j = 0; j < whole; j += L)
    for (int64_t l = 0; l < L; ++l) lane[l] += p[j + l] * d[j + l];
  if (whole + L <= keys) {
    for (int64_t l = 0; l < L; ++l) {
      const float t = p[whole + l] * d[whole + l];
      lane[l] += whole + l < visible ? t : 0.0f;
    }
  } else {
    float tp[L], td[L];
    for (int64_t l = 0; l < L; ++l) tp[l] = td[l] = 0.0f;
    for (int64_t l = 0; whole + l < visible; ++l) {
      tp[l] = p[whole + l];
      td[l] = d[whole + l];
    }
    for (int64_t l = 0; l < L; ++l) lane[l] += tp[l] * td[l];
  }
  const float dot = reduce_lanes(lane);
  for (int64_t j = 0; j < visible; ++j) d[j] = (p[j] * (d[j] - dot)) * scale;
  for (int64_t j = visible; j < keys; ++j) d[j] = 0.0f;
}

// d loss / d sink of one score row, read before causal_softmax_backward_row replaces g.
// Derivation: the row is a softmax over the visible scores s_j and the sink, P_j = e^{s_j} / Z and
// P_sink = e^{sink} / Z with Z = e^{sink} + sum_j e^{s_j}; the context sum_j P_j v_j reads no
// value for the sink, so with g_j = d loss / d P_j (g = dctx V^T) the sink's own g is 0. The
// softmax's Jacobian gives d loss / d z = P_z (g_z - sum_y P_y g_y) for every logit z of the row,
// the sum over the sink too, which adds P_sink * 0: the visible scores keep the plain backward,
// P_j (g_j - dot) with dot = sum_j P_j g_j (causal_softmax_backward_row, unchanged), and the sink
// gets P_sink (0 - dot) = -P_sink dot. P_sink is not saved: it is 1 - sum_j P_j (the saved row's
// deficit), floored at 0, within a few float ulps of 1 (the rounding of the row's sum); the
// layer's d sink[h] adds this over every row (query) of head h. p, g [visible]; both sums in
// kSoftmaxLanes lanes, element j in lane j % 16, closed by reduce_lanes (one order everywhere).
MOE_HD float sink_gradient_row(const float* p, const float* g, int64_t visible) {
  constexpr int64_t L = kSoftmaxLanes;
  float mass[L], dot[L];
  for (int64_t l = 0; l < L; ++l) mass[l] = dot[l] = 0.0f;
  for (int64_t j = 0; j < visible; ++j) {
    mass[j % L] += p[j];
    dot[j % L] += p[j] * g[j];
  }
  const float share = 1.0f - reduce_lanes(mass);
  return -(share > 0.0f ? share : 0.0f) * reduce_lanes(dot);
}

// The sinks' gradient from the rows' terms: sinks_grad[h] += the sum of row_terms over the rows
// of head h, rows laid out [batch, heads, queries], added in double in (batch, query) order, then
// rounded once: the same bits whatever runs it.
MOE_HD void sink_gradient_sum(const float* row_terms, int64_t batch, int64_t heads, int64_t queries,
                              int64_t h, float* sinks_grad) {
  double acc = 0.0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < queries; ++i) acc += row_terms[(b * heads + h) * queries + i];
  sinks_grad[h] += static_cast<float>(acc);
}

}  // namespace moe::kernels
