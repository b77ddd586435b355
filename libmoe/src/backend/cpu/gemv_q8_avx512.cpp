// The AVX-512 Q8_0 rows without VNNI (gemv_q8_rows.h): the target names no VNNI, so the compiler
// cannot put a VNNI instruction in the path AVX-512 CPUs without it run.
#include "backend/cpu/gemv_internal.h"

#if MOE_GEMV_X86
#define MOE_Q8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define MOE_Q8_VNNI 0
#define MOE_Q8_ENTRY q8_rows_avx512_plain
#include "backend/cpu/gemv_q8_rows.h"
#endif
