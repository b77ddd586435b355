// The CPU's activation spans (activation_rows.h): blocks of kActivationLanes floats through local
// buffers. With a compile-time block length the kernel bodies' loops vectorise whole.
#include "backend/cpu/activation_rows.h"

#include <algorithm>

#include "backend/cpu/vector_math.h"
#include "kernels/experts.h"

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

}  // namespace

void bias_gelu_span(const float* h_in, const float* bias, float* h_out, float* a, int64_t n) {
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t count = std::min(kLanes, n - j);
    alignas(64) float hb[kLanes], bb[kLanes], ab[kLanes];
    load(h_in + j, count, hb);
    if (bias) load(bias + j, count, bb);
    kernels::bias_gelu_row(hb, bias ? bb : nullptr, ab, kLanes);
    if (h_out) store(hb, count, h_out + j);
    store(ab, count, a + j);
  }
}

void gelu_backward_span(const float* h, const float* da, float* dh, int64_t n) {
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t count = std::min(kLanes, n - j);
    alignas(64) float hb[kLanes], gb[kLanes], db[kLanes];
    load(h + j, count, hb);
    load(da + j, count, gb);
    kernels::gelu_backward_row(hb, gb, db, kLanes);
    store(db, count, dh + j);
  }
}

void bias_swiglu_span(const float* h1_in, const float* h3, const float* bias, float* h1_out,
                      float* a, int64_t n) {
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t count = std::min(kLanes, n - j);
    alignas(64) float hb[kLanes], h3b[kLanes], bb[kLanes], ab[kLanes];
    load(h1_in + j, count, hb);
    load(h3 + j, count, h3b);
    if (bias) load(bias + j, count, bb);
    kernels::bias_swiglu_row(hb, h3b, bias ? bb : nullptr, ab, kLanes);
    if (h1_out) store(hb, count, h1_out + j);
    store(ab, count, a + j);
  }
}

void swiglu_backward_span(const float* h1, const float* h3, const float* da, float* dh1, float* dh3,
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

}  // namespace moe::cpu
