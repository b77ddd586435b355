// The CPU's activation loops, shared by the MoE experts (grouped_gemm.cpp: bias + activation per
// row) and the dense MLP (activation.cpp: the activation of a whole tensor). Spans of n floats.
//
// Bits: a span runs in blocks of kActivationLanes elements through local buffers (the last block
// zero-padded), so every element takes the same vector code (libmvec's tanhf / expf) whatever the
// span's length, its alignment, aliasing or the thread. A plain loop would not: its scalar
// remainder calls libm's scalar tanhf / expf, which differ from libmvec's vector ones (glibc 2.36:
// 121 million floats for tanhf), so an element at the end of a thread's chunk would take other
// bits than with another thread count. Callers cut tensors into spans at multiples of
// kActivationLanes. 64 rather than the 16 the experts' rows once used: the copies cost less a
// float (AMD Zen 4, GELU forward 1.88 against 2.25 ns a float; a plain loop 1.69).
//
// Tried and dropped (twice, docs/PERFORMANCE.md): a second copy of the GELU spans built for AVX2,
// calling libmvec's 8-lane tanhf (the same bits as its 4-lane one for all 2^32 floats, glibc 2.36).
// It was no faster where it was measured (AMD Zen 4: 2.25 against 2.22 ns an element).
#pragma once
#include <cstdint>

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

}  // namespace moe::cpu
