// The CPU's activation spans (activation_rows.h): blocks of kActivationLanes floats through local
// buffers. With a compile-time block length the kernel bodies' loops vectorise whole. The spans
// come in three copies (baseline x86-64, AVX2, AVX-512), one chosen by the CPU.
#include "backend/cpu/activation_rows.h"

#include <algorithm>

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

// One copy of the four spans for one instruction set.
#define MOE_ACTIVATION_COPY(suffix, target)                                                    \
  target void bias_gelu_##suffix(const float* h_in, const float* bias, float* h_out, float* a, \
                                 int64_t n) {                                                  \
    bias_gelu_body(h_in, bias, h_out, a, n);                                                   \
  }                                                                                            \
  target void gelu_backward_##suffix(const float* h, const float* da, float* dh, int64_t n) {  \
    gelu_backward_body(h, da, dh, n);                                                          \
  }                                                                                            \
  target void bias_swiglu_##suffix(const float* h1_in, const float* h3, const float* bias,     \
                                   float* h1_out, float* a, int64_t n) {                       \
    bias_swiglu_body(h1_in, h3, bias, h1_out, a, n);                                           \
  }                                                                                            \
  target void swiglu_backward_##suffix(const float* h1, const float* h3, const float* da,      \
                                       float* dh1, float* dh3, int64_t n) {                    \
    swiglu_backward_body(h1, h3, da, dh1, dh3, n);                                             \
  }

MOE_ACTIVATION_COPY(baseline, )
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
MOE_ACTIVATION_COPY(avx2, __attribute__((target("avx2"))))
MOE_ACTIVATION_COPY(avx512, __attribute__((target("avx512f"))))
bool isa_here(ActivationIsa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case ActivationIsa::avx512:
      return __builtin_cpu_supports("avx512f");
    case ActivationIsa::avx2:
      return __builtin_cpu_supports("avx2");
    default:
      return true;
  }
}
#else  // one copy
#define bias_gelu_avx2 bias_gelu_baseline
#define bias_gelu_avx512 bias_gelu_baseline
#define gelu_backward_avx2 gelu_backward_baseline
#define gelu_backward_avx512 gelu_backward_baseline
#define bias_swiglu_avx2 bias_swiglu_baseline
#define bias_swiglu_avx512 bias_swiglu_baseline
#define swiglu_backward_avx2 swiglu_backward_baseline
#define swiglu_backward_avx512 swiglu_backward_baseline
bool isa_here(ActivationIsa isa) { return isa == ActivationIsa::baseline; }
#endif

ActivationIsa& isa_in_use() {
  static ActivationIsa isa = isa_here(ActivationIsa::avx512) ? ActivationIsa::avx512
                             : isa_here(ActivationIsa::avx2) ? ActivationIsa::avx2
                                                             : ActivationIsa::baseline;
  return isa;
}

void bias_gelu_unchecked(ActivationIsa isa, const float* h_in, const float* bias, float* h_out,
                         float* a, int64_t n) {
  switch (isa) {
    case ActivationIsa::avx512:
      return bias_gelu_avx512(h_in, bias, h_out, a, n);
    case ActivationIsa::avx2:
      return bias_gelu_avx2(h_in, bias, h_out, a, n);
    default:
      return bias_gelu_baseline(h_in, bias, h_out, a, n);
  }
}

void gelu_backward_unchecked(ActivationIsa isa, const float* h, const float* da, float* dh,
                             int64_t n) {
  switch (isa) {
    case ActivationIsa::avx512:
      return gelu_backward_avx512(h, da, dh, n);
    case ActivationIsa::avx2:
      return gelu_backward_avx2(h, da, dh, n);
    default:
      return gelu_backward_baseline(h, da, dh, n);
  }
}

void bias_swiglu_unchecked(ActivationIsa isa, const float* h1_in, const float* h3,
                           const float* bias, float* h1_out, float* a, int64_t n) {
  switch (isa) {
    case ActivationIsa::avx512:
      return bias_swiglu_avx512(h1_in, h3, bias, h1_out, a, n);
    case ActivationIsa::avx2:
      return bias_swiglu_avx2(h1_in, h3, bias, h1_out, a, n);
    default:
      return bias_swiglu_baseline(h1_in, h3, bias, h1_out, a, n);
  }
}

void swiglu_backward_unchecked(ActivationIsa isa, const float* h1, const float* h3, const float* da,
                               float* dh1, float* dh3, int64_t n) {
  switch (isa) {
    case ActivationIsa::avx512:
      return swiglu_backward_avx512(h1, h3, da, dh1, dh3, n);
    case ActivationIsa::avx2:
      return swiglu_backward_avx2(h1, h3, da, dh1, dh3, n);
    default:
      return swiglu_backward_baseline(h1, h3, da, dh1, dh3, n);
  }
}

void require_supported(ActivationIsa isa) {
  if (!isa_here(isa))
    throw UsageError(
        str("cpu activations: the ", activation_isa_name(isa),
            " copy of the activation spans needs a CPU (and a GCC or Clang x86-64 build) "
            "with ",
            activation_isa_name(isa)));
}

}  // namespace

void bias_gelu_span(const float* h_in, const float* bias, float* h_out, float* a, int64_t n) {
  bias_gelu_unchecked(isa_in_use(), h_in, bias, h_out, a, n);
}

void gelu_backward_span(const float* h, const float* da, float* dh, int64_t n) {
  gelu_backward_unchecked(isa_in_use(), h, da, dh, n);
}

void bias_gelu_span_on(ActivationIsa isa, const float* h_in, const float* bias, float* h_out,
                       float* a, int64_t n) {
  require_supported(isa);
  bias_gelu_unchecked(isa, h_in, bias, h_out, a, n);
}

void gelu_backward_span_on(ActivationIsa isa, const float* h, const float* da, float* dh,
                           int64_t n) {
  require_supported(isa);
  gelu_backward_unchecked(isa, h, da, dh, n);
}

void bias_swiglu_span(const float* h1_in, const float* h3, const float* bias, float* h1_out,
                      float* a, int64_t n) {
  bias_swiglu_unchecked(isa_in_use(), h1_in, h3, bias, h1_out, a, n);
}

void swiglu_backward_span(const float* h1, const float* h3, const float* da, float* dh1, float* dh3,
                          int64_t n) {
  swiglu_backward_unchecked(isa_in_use(), h1, h3, da, dh1, dh3, n);
}

void bias_swiglu_span_on(ActivationIsa isa, const float* h1_in, const float* h3, const float* bias,
                         float* h1_out, float* a, int64_t n) {
  require_supported(isa);
  bias_swiglu_unchecked(isa, h1_in, h3, bias, h1_out, a, n);
}

void swiglu_backward_span_on(ActivationIsa isa, const float* h1, const float* h3, const float* da,
                             float* dh1, float* dh3, int64_t n) {
  require_supported(isa);
  swiglu_backward_unchecked(isa, h1, h3, da, dh1, dh3, n);
}

const char* activation_isa_name(ActivationIsa isa) {
  switch (isa) {
    case ActivationIsa::avx512:
      return "avx512";
    case ActivationIsa::avx2:
      return "avx2";
    default:
      return "baseline";
  }
}

bool activation_isa_supported(ActivationIsa isa) { return isa_here(isa); }

ActivationIsa activation_isa() { return isa_in_use(); }

void set_activation_isa(ActivationIsa isa) {
  require_supported(isa);
  isa_in_use() = isa;
}

}  // namespace moe::cpu
