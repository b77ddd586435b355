// The AVX-512 Q8_0 rows with VNNI (gemv_q8_rows.h): a block's integer sums by vpdpbusd. Called
// only where the CPU has AVX-512 VNNI (avx512_vnni_available()).
#include "backend/cpu/gemv_internal.h"

#if MOE_GEMV_X86
#define MOE_Q8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define MOE_Q8_VNNI 1
#define MOE_Q8_ENTRY q8_rows_avx512_vnni
#include "backend/cpu/gemv_q8_rows.h"
#endif
