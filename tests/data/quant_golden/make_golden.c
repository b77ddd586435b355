// Writes the golden files of tests/data/quant_golden/ through llama.cpp's ggml (not a dependency
// of moe: only this generator links it; make_golden.sh builds it).
//   make_golden inputs DIR   writes DIR/input.f32: kRows rows of kCols f32 values (hard cases)
//   make_golden DIR          reads DIR/input.f32, writes for each type T of q4_k q6_k mxfp4 q8_k
//                            q8_0: DIR/T.bin (ggml's bytes, rows concatenated) and DIR/T.deq.f32
//                            (its dequantised values); and DIR/dots.f32 (ggml's vec_dot of each
//                            weight type's row r with the activation row s, r, s < kRows).
// All files are little-endian (the byte order of the x86 machine that writes them).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-cpu.h"
#include "ggml.h"

// Q8_K has no entry in ggml's public type traits: its reference functions from ggml-quants.h (the
// block pointers as void*, the same ABI).
void quantize_row_q8_K_ref(const float* x, void* y, int64_t k);
void dequantize_row_q8_K(const void* x, float* y, int64_t k);

enum { kRows = 3, kCols = 1024, kBlock = 256 };

static uint64_t state = 0x9e3779b97f4a7c15ull;
static double uniform(void) {  // xorshift64*: the same inputs on every machine
  state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
  return (double)((state * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}
static float normal(void) {  // Irwin-Hall (12 uniforms): no libm, so no libm differences
  double s = -6;
  for (int i = 0; i < 12; ++i) s += uniform();
  return (float)s;
}

// Values half-way between two levels. The block's largest value, 127, makes Q8_K's scale -1 and
// the first 32 values' Q8_0 scale 1: half-integers tie for both (nearest-even, resp. away from
// zero). The other 32-value blocks start with 8, so MXFP4's levels are 0 1 2 3 4 6 8 12 and
// 0.5 1.5 2.5 3.5 5 7 10 tie (it keeps the first level in table order).
static float tie(int i) {
  static const float mx_ties[] = {0.5f, 1.5f, 2.5f, 3.5f, 5.0f, 7.0f, 10.0f, 3.0f};
  const float sign = (i / 2) % 2 ? -1.0f : 1.0f;
  if (i == 0) return 127.0f;
  if (i < 32) return sign * (0.5f + (float)(i % 16));
  if (i % 32 == 0) return 8.0f;
  return sign * mx_ties[i % 8];
}

// One 256-value block of each hard case, four to a row.
static void fill_case(int which, float* b) {
  for (int i = 0; i < kBlock; ++i) {
    const float z = normal();
    switch (which) {
      case 0: b[i] = 0.0f; break;                        // all zero
      case 1: b[i] = 0.75f; break;                       // constant
      case 2: b[i] = 0.02f * z; break;                   // one huge outlier (below)
      case 3: b[i] = 1e-30f * z; break;                  // tiny magnitudes
      case 4: b[i] = -(0.1f + 0.5f * fabsf(z)); break;   // all negative
      case 5: b[i] = 3.9e6f * (float)(2 * uniform() - 1); break;  // q4_K dmin near 65504
      case 6: b[i] = 1e-3f * z; break;                   // f16-subnormal scales
      case 7: b[i] = 0.5f * z; break;                    // mixed, with MXFP4's log2f edge
      case 8: b[i] = (0.01f + 0.2f * (float)(i / 32) / 8) * z; break;  // realistic normal
      case 9: b[i] = tie(i); break;                      // ties of every rounding rule
      default: b[i] = 0.05f * z * fabsf(z); break;       // heavy tails
    }
  }
  if (which == 2) b[37] = 1000.0f;
  if (which == 7) b[3] = 7.99999952f;                    // just below 8: log2f rounds up to 3
}

static void write_file(const char* dir, const char* name, const void* p, size_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE* f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f)) { perror(path); exit(1); }
}

int main(int argc, char** argv) {
  static float x[kRows * kCols];
  if (argc == 3 && strcmp(argv[1], "inputs") == 0) {
    for (int b = 0; b < kRows * kCols / kBlock; ++b) fill_case(b, x + b * kBlock);
    write_file(argv[2], "input.f32", x, sizeof x);
    return 0;
  }
  if (argc != 2) { fprintf(stderr, "usage: make_golden [inputs] DIR\n"); return 2; }
  char path[4096];
  snprintf(path, sizeof path, "%s/input.f32", argv[1]);
  FILE* f = fopen(path, "rb");
  if (!f || fread(x, sizeof x, 1, f) != 1) { perror(path); return 1; }
  fclose(f);
  ggml_cpu_init();
  const enum ggml_type types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_MXFP4, GGML_TYPE_Q8_K,
                                  GGML_TYPE_Q8_0};
  const char* names[] = {"q4_k", "q6_k", "mxfp4", "q8_k", "q8_0"};
  static uint8_t q[5][kRows * kCols * 2];  // more than any type's rows
  static float deq[kRows * kCols];
  for (int t = 0; t < 5; ++t) {
    const struct ggml_type_traits* tr = ggml_get_type_traits(types[t]);
    const size_t row_bytes = ggml_row_size(types[t], kCols);
    memset(q[t], 0, sizeof q[t]);  // q8_K leaves an all-zero block's bsums unwritten
    if (types[t] == GGML_TYPE_Q8_K) {  // not a ggml_quantize_chunk type: its reference row
      for (int r = 0; r < kRows; ++r) quantize_row_q8_K_ref(x + r * kCols, q[t] + r * row_bytes, kCols);
    } else {
      ggml_quantize_chunk(types[t], x, q[t], 0, kRows, kCols, NULL);
    }
    for (int r = 0; r < kRows; ++r) {
      if (types[t] == GGML_TYPE_Q8_K) dequantize_row_q8_K(q[t] + r * row_bytes, deq + r * kCols, kCols);
      else tr->to_float(q[t] + r * row_bytes, deq + r * kCols, kCols);
    }
    char name[64];
    snprintf(name, sizeof name, "%s.bin", names[t]);
    write_file(argv[1], name, q[t], kRows * row_bytes);
    snprintf(name, sizeof name, "%s.deq.f32", names[t]);
    write_file(argv[1], name, deq, sizeof deq);
  }
  // dots[w][r][s]: weight type w (q4_k, q6_k: with q8_k; mxfp4: with q8_0), rows r and s.
  float dots[3][kRows][kRows];
  for (int w = 0; w < 3; ++w) {
    const struct ggml_type_traits_cpu* cpu = ggml_get_type_traits_cpu(types[w]);
    const int act = cpu->vec_dot_type == GGML_TYPE_Q8_K ? 3 : 4;
    for (int r = 0; r < kRows; ++r)
      for (int s = 0; s < kRows; ++s)
        cpu->vec_dot(kCols, &dots[w][r][s], 0, q[w] + r * ggml_row_size(types[w], kCols), 0,
                     q[act] + s * ggml_row_size(types[act], kCols), 0, 1);
  }
  write_file(argv[1], "dots.f32", dots, sizeof dots);
  return 0;
}
