// Restores the CPU GEMM tile kernel a test chose with cpu::set_gemm_kernel.
#pragma once
#include "backend/cpu/gemm.h"

namespace moe::test {

struct GemmKernelGuard {
  cpu::GemmKernel before = cpu::gemm_kernel();
  ~GemmKernelGuard() { cpu::set_gemm_kernel(before); }
};

}  // namespace moe::test
