// Kernel bodies of the core ops (grid.h): elementwise, grid-stride, no barriers. Compiled by nvcc
// for the device and by the host compiler for the CPU harness tests.
#pragma once
#include "backend/cuda/grid.h"
#include "kernels/convert.h"

namespace moe::cuda::body {

// Storage formats a floating tensor may have.
enum class Format : int { f32 = 0, bf16 = 1, f16 = 2 };

MOE_HD float load_as_f32(const void* p, Format f, int64_t i) {
  if (f == Format::f32) return static_cast<const float*>(p)[i];
  uint16_t h = static_cast<const uint16_t*>(p)[i];
  return f == Format::bf16 ? kernels::bf16_to_f32(h) : kernels::f16_to_f32(h);
}
MOE_HD void store_from_f32(void* p, Format f, int64_t i, float v) {
  if (f == Format::f32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] =
        f == Format::bf16 ? kernels::f32_to_bf16(v) : kernels::f32_to_f16(v);
  }
}

struct Convert {
  MOE_HD static void run(Thread th, const void* src, int src_format, void* dst, int dst_format,
                         int64_t n) {
    MOE_GRID_LOOP(i, n, th) {
      store_from_f32(dst, static_cast<Format>(dst_format), i,
                     load_as_f32(src, static_cast<Format>(src_format), i));
    }
  }
};

// fill: 4-byte words (f32 bits or i32) or 2-byte words (bf16/f16 bits).
struct Fill32 {
  MOE_HD static void run(Thread th, uint32_t* p, uint32_t word, int64_t n) {
    MOE_GRID_LOOP(i, n, th) { p[i] = word; }
  }
};
struct Fill16 {
  MOE_HD static void run(Thread th, uint16_t* p, uint16_t word, int64_t n) {
    MOE_GRID_LOOP(i, n, th) { p[i] = word; }
  }
};

struct Axpy {
  MOE_HD static void run(Thread th, float alpha, const float* x, float* y, int64_t n) {
    MOE_GRID_LOOP(i, n, th) { y[i] += alpha * x[i]; }
  }
};

// Rounds fp32 values to what bf16 (format 1) or f16 (format 2) stores.
struct RoundTo {
  MOE_HD static void run(Thread th, float* p, int format, int64_t n) {
    MOE_GRID_LOOP(i, n, th) {
      p[i] = format == 1 ? kernels::bf16_to_f32(kernels::f32_to_bf16(p[i]))
                         : kernels::f16_to_f32(kernels::f32_to_f16(p[i]));
    }
  }
};

// partial[global thread] = sum of x[i]^2 (fp64) over the thread's grid-stride indices.
struct SumSquaresPartial {
  MOE_HD static void run(Thread th, const float* x, int64_t n, double* partial) {
    double s = 0;
    MOE_GRID_LOOP(i, n, th) { s += static_cast<double>(x[i]) * x[i]; }
    partial[th.global()] = s;
  }
};

}  // namespace moe::cuda::body
