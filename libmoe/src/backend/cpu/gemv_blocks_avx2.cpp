// The AVX2 copy of the block-format dot products (gemv_blocks_simd.h: vpmaddubsw + vpmaddwd).
// Called only where the CPU has AVX2 and FMA (vector_isa_supported(VectorIsa::avx2)).
#include "backend/cpu/gemv_internal.h"

#if MOE_GEMV_X86
#define MOE_BLK_TARGET __attribute__((target("avx2,fma,f16c")))
#define MOE_BLK_VNNI 0
#define MOE_BLK_WIDE 0
#define MOE_BLK_ENTRY dot_block_row_avx2
#include "backend/cpu/gemv_blocks_simd.h"
#endif
