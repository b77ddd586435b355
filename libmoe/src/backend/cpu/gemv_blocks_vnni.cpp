// The AVX-512 VNNI copy of the block-format dot products (gemv_blocks_simd.h): a block's integer
// sums by vpdpbusd. Called only where the CPU has AVX-512 VNNI (avx512_vnni_available()).
#include "backend/cpu/gemv_internal.h"

#if MOE_GEMV_X86
#define MOE_BLK_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define MOE_BLK_VNNI 1
#define MOE_BLK_WIDE 1
#define MOE_BLK_ENTRY dot_block_row_vnni
#include "backend/cpu/gemv_blocks_simd.h"
#endif
