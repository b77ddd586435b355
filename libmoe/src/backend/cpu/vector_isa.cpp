#include "backend/cpu/vector_isa.h"

namespace moe::cpu {

const char* vector_isa_name(VectorIsa isa) {
  switch (isa) {
    case VectorIsa::baseline:
      return "baseline";
    case VectorIsa::avx2:
      return "avx2";
    case VectorIsa::avx512:
      return "avx512";
  }
  return "?";
}

bool vector_isa_supported(VectorIsa isa) {
#if MOE_VECTOR_ISA_X86
  __builtin_cpu_init();
  switch (isa) {
    case VectorIsa::baseline:
      return true;
    case VectorIsa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case VectorIsa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma");
  }
  return false;
#else
  return isa == VectorIsa::baseline;
#endif
}

std::vector<VectorIsa> vector_isas_supported() {
  std::vector<VectorIsa> out;
  for (VectorIsa isa : {VectorIsa::baseline, VectorIsa::avx2, VectorIsa::avx512})
    if (vector_isa_supported(isa)) out.push_back(isa);
  return out;
}

VectorIsa vector_isa_best() {
  static const VectorIsa best = vector_isas_supported().back();
  return best;
}

}  // namespace moe::cpu
