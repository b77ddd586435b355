// The CPU's activation loops, shared by the MoE experts (grouped_gemm.cpp: bias + activation per
// row) and the dense MLP (activation.cpp: the activation of a whole tensor), spans of n floats;
// and attention's causal softmax rows (attention.cpp), which take the same exp_f and come in the
// same copies.
//
// Bits: a span runs in blocks of kActivationLanes elements through local buffers (the last block
// zero-padded), so every element takes the same vector code whatever the span's length, its
// alignment, aliasing or the thread. (The dense ops once ran plain loops, whose scalar remainder
// called libm's scalar tanhf / expf where the rest called libmvec's vector ones, which differ:
// an element at the end of a thread's chunk took other bits than with another thread count.)
// Callers cut tensors into spans at multiples of kActivationLanes. 64 rather than the 16 the
// experts' rows once used: the copies cost less a float.
//
// The math is kernels::exp_f and kernels::tanh_f (IEEE adds, multiplies and a divide in a fixed
// order, no libm call, no contraction), so the spans are built once per cpu::VectorIsa, baseline
// x86-64 (4 lanes), AVX2 (8) and AVX-512 (16), and the widest the CPU has runs. The bits are the
// same in each: the operations are the same, lane by lane (test_activation_rows.cpp compares the
// copies on 1/64 of all floats, every sign and exponent; NaN results are NaN in each, but their
// sign and payload can follow the vectoriser's operand order). libmvec's tanhf / expf could not be
// used so: their AVX-512 (tanhf) and AVX2 (expf) variants round differently from their SSE4.1 ones.
#pragma once
#include <cstdint>

#include "backend/cpu/vector_isa.h"
#include "moe/op_types.h"

namespace moe::cpu {

inline constexpr int64_t kActivationLanes = 64;

// GELU forward: v = h_in + bias (bias may be null), a = gelu(v); h_out (may be null, may be h_in)
// keeps v for the backward.
void bias_gelu_span(const float* h_in, const float* bias, float* h_out, float* a, int64_t n);
// GELU backward: dh = da * gelu'(h). dh may alias da.
void gelu_backward_span(const float* h, const float* da, float* dh, int64_t n);
// SwiGLU forward: v = h1_in + bias (bias may be null), a = silu(v) * h3; h1_out as h_out above.
void bias_swiglu_span(const float* h1_in, const float* h3, const float* bias, float* h1_out,
                      float* a, int64_t n);
// SwiGLU backward: dh1 = da * h3 * silu'(h1), dh3 = da * silu(h1). Outputs may alias inputs.
void swiglu_backward_span(const float* h1, const float* h3, const float* da, float* dh1, float* dh3,
                          int64_t n);
// Clamped SwiGLU (gpt-oss) forward: v = h1_in + bias (bias may be null), g = min(v, limit),
// u = clamp(h3, -limit, limit), a = (u + 1) * g * sigmoid(alpha g); h1_out as h_out above.
void bias_clamped_swiglu_span(const float* h1_in, const float* h3, const float* bias,
                              SwigluClamp clamp, float* h1_out, float* a, int64_t n);
// Its backward (kernels::clamped_swiglu_backward_row: zero where a clamp bites). Outputs may alias
// inputs.
void clamped_swiglu_backward_span(const float* h1, const float* h3, const float* da,
                                  SwigluClamp clamp, float* dh1, float* dh3, int64_t n);

// The causal softmax of one score row and its backward: kernels::causal_softmax_row and
// causal_softmax_backward_row (kernels/attention.h, what a GPU thread runs), at this copy's width;
// the same bits.
void causal_softmax_row(float* p, int64_t visible, int64_t keys);
void causal_softmax_backward_row(const float* p, float* d, int64_t visible, int64_t keys,
                                 float scale);

// Which copy of the spans runs (vector_isa_best() unless a test sets another; tests compare the
// copies on one host). set_activation_isa throws UsageError when this CPU (or build) lacks it;
// not thread-safe: call between ops.
VectorIsa activation_isa();
void set_activation_isa(VectorIsa isa);
// The spans on a given copy, whatever the process uses; throw UsageError when unsupported.
void bias_gelu_span_on(VectorIsa isa, const float* h_in, const float* bias, float* h_out, float* a,
                       int64_t n);
void gelu_backward_span_on(VectorIsa isa, const float* h, const float* da, float* dh, int64_t n);
void bias_swiglu_span_on(VectorIsa isa, const float* h1_in, const float* h3, const float* bias,
                         float* h1_out, float* a, int64_t n);
void swiglu_backward_span_on(VectorIsa isa, const float* h1, const float* h3, const float* da,
                             float* dh1, float* dh3, int64_t n);
void bias_clamped_swiglu_span_on(VectorIsa isa, const float* h1_in, const float* h3,
                                 const float* bias, SwigluClamp clamp, float* h1_out, float* a,
                                 int64_t n);
void clamped_swiglu_backward_span_on(VectorIsa isa, const float* h1, const float* h3,
                                     const float* da, SwigluClamp clamp, float* dh1, float* dh3,
                                     int64_t n);
void causal_softmax_row_on(VectorIsa isa, float* p, int64_t visible, int64_t keys);
void causal_softmax_backward_row_on(VectorIsa isa, const float* p, float* d, int64_t visible,
                                    int64_t keys, float scale);

}  // namespace moe::cpu
