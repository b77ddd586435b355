// The AVX-512 copy of the block-format dot products without VNNI (gemv_blocks_simd.h), for
// AVX-512 CPUs without it (Skylake-SP): the target names no VNNI instruction.
#include "backend/cpu/gemv_internal.h"

#if MOE_GEMV_X86
#define MOE_BLK_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define MOE_BLK_VNNI 0
#define MOE_BLK_WIDE 1
#define MOE_BLK_ENTRY dot_block_row_avx512
#include "backend/cpu/gemv_blocks_simd.h"
#endif
