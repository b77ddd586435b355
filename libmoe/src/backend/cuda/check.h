// Checked CUDA runtime and cuBLAS calls: a failing call throws moe::Error naming the statement, the
// library's error text, and the file and line. Kernel launches are followed by
// MOE_CUDA_CHECK_LAUNCH(), which reports launch-configuration errors at the launch site.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace moe::cuda {

[[noreturn]] void throw_call_error(const char* library, const char* statement, const char* message,
                                   const char* file, int line);
const char* cublas_status_text(cublasStatus_t status);

}  // namespace moe::cuda

#define MOE_CUDA_CHECK(statement)                                                          \
  do {                                                                                     \
    cudaError_t moe_cuda_err_ = (statement);                                               \
    if (moe_cuda_err_ != cudaSuccess)                                                      \
      ::moe::cuda::throw_call_error("CUDA", #statement, cudaGetErrorString(moe_cuda_err_), \
                                    __FILE__, __LINE__);                                   \
  } while (0)

#define MOE_CUBLAS_CHECK(statement)                                                            \
  do {                                                                                         \
    cublasStatus_t moe_cublas_st_ = (statement);                                               \
    if (moe_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::moe::cuda::throw_call_error("cuBLAS", #statement,                                      \
                                    ::moe::cuda::cublas_status_text(moe_cublas_st_), __FILE__, \
                                    __LINE__);                                                 \
  } while (0)

#define MOE_CUDA_CHECK_LAUNCH() MOE_CUDA_CHECK(cudaGetLastError())
