// The instruction sets the CPU backend compiles its vector loops for, one copy each (the AdamW
// update, adamw.cpp; the activation spans, activation_rows.cpp): x86-64 baseline (SSE2), AVX2 +
// FMA, and AVX-512 (F, BW, VL, with AVX2 and FMA). The library targets baseline x86-64, so the wide
// copies come from per-function target attributes (the macros below), and the copy that runs is
// picked at run time from the CPU's features alone. Every such loop gives the same bits in each
// copy: its file builds with -ffp-contract=off and its operations are correctly rounded at every
// vector width, so the choice changes speed only (each loop's test compares the copies bitwise).
#pragma once
#include <vector>

namespace moe::cpu {

enum class VectorIsa { baseline, avx2, avx512 };
const char* vector_isa_name(VectorIsa isa);
// Whether this CPU runs `isa`, and this build has its copies (x86-64, GCC or Clang).
bool vector_isa_supported(VectorIsa isa);
std::vector<VectorIsa> vector_isas_supported();  // baseline first
VectorIsa vector_isa_best();                     // the widest supported

}  // namespace moe::cpu

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MOE_VECTOR_ISA_X86 1
#if defined(__clang__)
#define MOE_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#else
// GCC's generic tuning prefers 256-bit vectors even where AVX-512 is enabled.
#define MOE_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,prefer-vector-width=512")))
#endif
#define MOE_TARGET_AVX2 __attribute__((target("avx2,fma")))
#endif
