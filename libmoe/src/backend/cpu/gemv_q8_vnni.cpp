// The AVX-512 Q8_0 rows with VNNI (gemv_q8_rows.h): a block's integer sums by vpdpbusd. Called
// only where the CPU has AVX-512 VNNI (avx512_vnni_available()).
#include "backend/cpu/gemv_internal.h"

#if MOE_GEMV_X86
#define MOE_Q8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define MOE_Q8_VNNI 1
#include "backend/cpu/gemv_q8_rows.h"

namespace moe::cpu::gemv_detail {
void q8_rows_avx512_vnni(const GemvProblem& p, const Q8Input& x, int64_t begin, int64_t end) {
  q8_rows(p, x, begin, end);
}
}  // namespace moe::cpu::gemv_detail
#endif
