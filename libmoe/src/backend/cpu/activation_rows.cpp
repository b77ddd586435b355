// The CPU's activation spans (activation_rows.h): blocks of kActivationLanes floats through local
// buffers. With a compile-time block length the kernel bodies' loops vectorise whole. The spans
// come in one copy per cpu::VectorIsa, the best the CPU has chosen once.
#include "backend/cpu/activation_rows.h"

#include <algorithm>

#include "backend/cpu/vector_isa.h"
#include "kernels/attention.h"
#include "kernels/experts.h"
#include "moe/error.h"

namespace moe::cpu {
namespace {

constexpr int64_t kLanes = kActivationLanes;

// count (1..kLanes) floats of src into a block, the rest zero; and back.
inline void load(const float* src, int64_t count, float* block) {
  if (count == kLanes) {
    std::copy(src, src + kLanes, block);
  } else {
    std::fill(block, block + kLanes, 0.0f);
    std::copy(src, src + count, block);
  }
}
inline void store(const float* block, int64_t count, float* dst) {
  std::copy(block, block + count, dst);
}

// The bodies, inlined into each instruction set's copy below: with a compile-time block length
// the loops vectorise whole, at the width of the function they are inlined into.
[[gnu::always_inline]] inline void bias_gelu_body(const float* h_in, const float* bias,
                                                  float* h_out, float* a, int64_t n) {
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t count = std::min(kLanes, n - j);
    alignas(64) float hb[kLanes], bb[kLanes], ab[kLanes];
    load(h_in + j, count, hb);
    // Two calls rather than one with `bias ? bb : nullptr`: each inlined loop then knows its bias
    // and has no conditional load, which the baseline copy could not vectorise.
    if (bias) {
      load(bias + j, count, bb);
      kernels::bias_gelu_row(hb, bb, ab, kLanes);
    } else {
      kernels::bias_gelu_row(hb, nullptr, ab, kLanes);
    }
    if (h_out) store(hb, count, h_out + j);
    store(ab, count, a + j);
  }
}

[[gnu::always_inline]] inline void gelu_backward_body(const float* h, const float* da, float* dh,
                                                      int64_t n) {
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t count = std::min(kLanes, n - j);
    alignas(64) float hb[kLanes], gb[kLanes], db[kLanes];
    load(h + j, count, hb);
    load(da + j, count, gb);
    kernels::gelu_backward_row(hb, gb, db, kLanes);
    store(db, count, dh + j);
  }
}

[[gnu::always_inline]] inline void bias_swiglu_body(const float* h1_in, const float* h3,
                                                    const float* bias, float* h1_out, float* a,
                                                    int64_t n) {
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t count = std::min(kLanes, n - j);
    alignas(64) float hb[kLanes], h3b[kLanes], bb[kLanes], ab[kLanes];
    load(h1_in + j, count, hb);
    load(h3 + j, count, h3b);
    if (bias) {  // two calls, as in bias_gelu_body
      load(bias + j, count, bb);
      kernels::bias_swiglu_row(hb, h3b, bb, ab, kLanes);
    } else {
      kernels::bias_swiglu_row(hb, h3b, nullptr, ab, kLanes);
    }
    if (h1_out) store(hb, count, h1_out + j);
    store(ab, count, a + j);
  }
}

[[gnu::always_inline]] inline void swiglu_backward_body(const float* h1, const float* h3,
                                                        const float* da, float* dh1, float* dh3,
                                                        int64_t n) {
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t count = std::min(kLanes, n - j);
    alignas(64) float hb[kLanes], h3b[kLanes], gb[kLanes], db[kLanes], d3b[kLanes];
    load(h1 + j, count, hb);
    load(h3 + j, count, h3b);
    load(da + j, count, gb);
    kernels::swiglu_backward_row(hb, h3b, gb, db, d3b, kLanes);
    store(db, count, dh1 + j);
    store(d3b, count, dh3 + j);
  }
}

[[gnu::always_inline]] inline void bias_clamped_swiglu_body(const float* h1_in, const float* h3,
                                                            const float* bias, SwigluClamp clamp,
                                                            float* h1_out, float* a, int64_t n) {
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t count = std::min(kLanes, n - j);
    alignas(64) float hb[kLanes], h3b[kLanes], bb[kLanes], ab[kLanes];
    load(h1_in + j, count, hb);
    load(h3 + j, count, h3b);
    if (bias) {  // two calls, as in bias_gelu_body
      load(bias + j, count, bb);
      kernels::bias_clamped_swiglu_row(hb, h3b, bb, clamp.alpha, clamp.limit, ab, kLanes);
    } else {
      kernels::bias_clamped_swiglu_row(hb, h3b, nullptr, clamp.alpha, clamp.limit, ab, kLanes);
    }
    if (h1_out) store(hb, count, h1_out + j);
    store(ab, count, a + j);
  }
}

[[gnu::always_inline]] inline void clamped_swiglu_backward_body(const float* h1, const float* h3,
                                                                const float* da, SwigluClamp clamp,
                                                                float* dh1, float* dh3, int64_t n) {
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t count = std::min(kLanes, n - j);
    alignas(64) float hb[kLanes], h3b[kLanes], gb[kLanes], db[kLanes], d3b[kLanes];
    load(h1 + j, count, hb);
    load(h3 + j, count, h3b);
    load(da + j, count, gb);
    kernels::clamped_swiglu_backward_row(hb, h3b, gb, clamp.alpha, clamp.limit, db, d3b, kLanes);
    store(db, count, dh1 + j);
    store(d3b, count, dh3 + j);
  }
}

// The six spans and the two softmax rows compiled for one instruction set, and a table of them.
// Every copy is flattened: the bodies and the kernels' math are inlined into it, so each runs at
// the copy's width (the softmax rows' bodies are larger than GCC inlines on its own; one left out
// of line ran at the baseline width in every copy: the same bits, slower).
struct Copy {
  void (*bias_gelu)(const float*, const float*, float*, float*, int64_t);
  void (*gelu_backward)(const float*, const float*, float*, int64_t);
  void (*bias_swiglu)(const float*, const float*, const float*, float*, float*, int64_t);
  void (*swiglu_backward)(const float*, const float*, const float*, float*, float*, int64_t);
  void (*bias_clamped_swiglu)(const float*, const float*, const float*, SwigluClamp, float*, float*,
                              int64_t);
  void (*clamped_swiglu_backward)(const float*, const float*, const float*, SwigluClamp, float*,
                                  float*, int64_t);
  void (*softmax)(float*, int64_t, int64_t);
  void (*softmax_backward)(const float*, float*, int64_t, int64_t, float);
};

#define MOE_ACTIVATION_COPY(suffix, target)                                                       \
  [[gnu::flatten]] target void bias_gelu_##suffix(const float* h_in, const float* bias,           \
                                                  float* h_out, float* a, int64_t n) {            \
    bias_gelu_body(h_in, bias, h_out, a, n);                                                      \
  }                                                                                               \
  [[gnu::flatten]] target void gelu_backward_##suffix(const float* h, const float* da, float* dh, \
                                                      int64_t n) {                                \
    gelu_backward_body(h, da, dh, n);                                                             \
  }                                                                                               \
  [[gnu::flatten]] target void bias_swiglu_##suffix(const float* h1_in, const float* h3,          \
                                                    const float* bias, float* h1_out, float* a,   \
                                                    int64_t n) {                                  \
    bias_swiglu_body(h1_in, h3, bias, h1_out, a, n);                                              \
  }                                                                                               \
  [[gnu::flatten]] target void swiglu_backward_##suffix(                                          \
      const float* h1, const float* h3, const float* da, float* dh1, float* dh3, int64_t n) {     \
    swiglu_backward_body(h1, h3, da, dh1, dh3, n);                                                \
  }                                                                                               \
  [[gnu::flatten]] target void bias_clamped_swiglu_##suffix(const float* h1_in, const float* h3,  \
                                                            const float* bias, SwigluClamp clamp, \
                                                            float* h1_out, float* a, int64_t n) { \
    bias_clamped_swiglu_body(h1_in, h3, bias, clamp, h1_out, a, n);                               \
  }                                                                                               \
  [[gnu::flatten]] target void clamped_swiglu_backward_##suffix(                                  \
      const float* h1, const float* h3, const float* da, SwigluClamp clamp, float* dh1,           \
      float* dh3, int64_t n) {                                                                    \
    clamped_swiglu_backward_body(h1, h3, da, clamp, dh1, dh3, n);                                 \
  }                                                                                               \
  [[gnu::flatten]] target void softmax_##suffix(float* p, int64_t visible, int64_t keys) {        \
    kernels::causal_softmax_row(p, visible, keys);                                                \
  }                                                                                               \
  [[gnu::flatten]] target void softmax_backward_##suffix(                                         \
      const float* p, float* d, int64_t visible, int64_t keys, float scale) {                     \
    kernels::causal_softmax_backward_row(p, d, visible, keys, scale);                             \
  }                                                                                               \
  constexpr Copy k_##suffix{                                                                      \
      bias_gelu_##suffix,       gelu_backward_##suffix,       bias_swiglu_##suffix,               \
      swiglu_backward_##suffix, bias_clamped_swiglu_##suffix, clamped_swiglu_backward_##suffix,   \
      softmax_##suffix,         softmax_backward_##suffix};

MOE_ACTIVATION_COPY(baseline, )
#if MOE_VECTOR_ISA_X86
MOE_ACTIVATION_COPY(avx2, MOE_TARGET_AVX2)
MOE_ACTIVATION_COPY(avx512, MOE_TARGET_AVX512)
#endif

// The copy for `isa` (where the build has no wide copies, vector_isa_supported refuses them).
const Copy& copy_for(VectorIsa isa) {
#if MOE_VECTOR_ISA_X86
  if (isa == VectorIsa::avx512) return k_avx512;
  if (isa == VectorIsa::avx2) return k_avx2;
#endif
  (void)isa;
  return k_baseline;
}

VectorIsa& isa_in_use() {
  static VectorIsa isa = vector_isa_best();
  return isa;
}

const Copy& checked(VectorIsa isa) {
  if (!vector_isa_supported(isa))
    throw UsageError(str("cpu activations: the ", vector_isa_name(isa),
                         " copy of the activation spans needs a CPU (and a GCC or Clang x86-64 "
                         "build) with ",
                         vector_isa_name(isa)));
  return copy_for(isa);
}

}  // namespace

void bias_gelu_span(const float* h_in, const float* bias, float* h_out, float* a, int64_t n) {
  copy_for(isa_in_use()).bias_gelu(h_in, bias, h_out, a, n);
}

void gelu_backward_span(const float* h, const float* da, float* dh, int64_t n) {
  copy_for(isa_in_use()).gelu_backward(h, da, dh, n);
}

void bias_swiglu_span(const float* h1_in, const float* h3, const float* bias, float* h1_out,
                      float* a, int64_t n) {
  copy_for(isa_in_use()).bias_swiglu(h1_in, h3, bias, h1_out, a, n);
}

void swiglu_backward_span(const float* h1, const float* h3, const float* da, float* dh1, float* dh3,
                          int64_t n) {
  copy_for(isa_in_use()).swiglu_backward(h1, h3, da, dh1, dh3, n);
}

void bias_clamped_swiglu_span(const float* h1_in, const float* h3, const float* bias,
                              SwigluClamp clamp, float* h1_out, float* a, int64_t n) {
  copy_for(isa_in_use()).bias_clamped_swiglu(h1_in, h3, bias, clamp, h1_out, a, n);
}

void clamped_swiglu_backward_span(const float* h1, const float* h3, const float* da,
                                  SwigluClamp clamp, float* dh1, float* dh3, int64_t n) {
  copy_for(isa_in_use()).clamped_swiglu_backward(h1, h3, da, clamp, dh1, dh3, n);
}

void bias_clamped_swiglu_span_on(VectorIsa isa, const float* h1_in, const float* h3,
                                 const float* bias, SwigluClamp clamp, float* h1_out, float* a,
                                 int64_t n) {
  checked(isa).bias_clamped_swiglu(h1_in, h3, bias, clamp, h1_out, a, n);
}

void clamped_swiglu_backward_span_on(VectorIsa isa, const float* h1, const float* h3,
                                     const float* da, SwigluClamp clamp, float* dh1, float* dh3,
                                     int64_t n) {
  checked(isa).clamped_swiglu_backward(h1, h3, da, clamp, dh1, dh3, n);
}

void bias_gelu_span_on(VectorIsa isa, const float* h_in, const float* bias, float* h_out, float* a,
                       int64_t n) {
  checked(isa).bias_gelu(h_in, bias, h_out, a, n);
}

void gelu_backward_span_on(VectorIsa isa, const float* h, const float* da, float* dh, int64_t n) {
  checked(isa).gelu_backward(h, da, dh, n);
}

void bias_swiglu_span_on(VectorIsa isa, const float* h1_in, const float* h3, const float* bias,
                         float* h1_out, float* a, int64_t n) {
  checked(isa).bias_swiglu(h1_in, h3, bias, h1_out, a, n);
}

void swiglu_backward_span_on(VectorIsa isa, const float* h1, const float* h3, const float* da,
                             float* dh1, float* dh3, int64_t n) {
  checked(isa).swiglu_backward(h1, h3, da, dh1, dh3, n);
}

void causal_softmax_row(float* p, int64_t visible, int64_t keys) {
  copy_for(isa_in_use()).softmax(p, visible, keys);
}

void causal_softmax_backward_row(const float* p, float* d, int64_t visible, int64_t keys,
                                 float scale) {
  copy_for(isa_in_use()).softmax_backward(p, d, visible, keys, scale);
}

void causal_softmax_row_on(VectorIsa isa, float* p, int64_t visible, int64_t keys) {
  checked(isa).softmax(p, visible, keys);
}

void causal_softmax_backward_row_on(VectorIsa isa, const float* p, float* d, int64_t visible,
                                    int64_t keys, float scale) {
  checked(isa).softmax_backward(p, d, visible, keys, scale);
}

VectorIsa activation_isa() { return isa_in_use(); }

void set_activation_isa(VectorIsa isa) {
  checked(isa);
  isa_in_use() = isa;
}

}  // namespace moe::cpu
