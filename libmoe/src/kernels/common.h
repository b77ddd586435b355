// Single-source kernel bodies: MOE_HD functions are compiled for the CPU loops in backend/cpu and,
// under nvcc, for the CUDA kernels in backend/cuda. Keep them free of allocation, exceptions and
// std:: containers.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MOE_HD __host__ __device__ inline
#else
#define MOE_HD inline
#endif
