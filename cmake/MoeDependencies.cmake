# Every dependency comes from a Debian package or the CUDA toolkit; scripts/setup installs them.
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json 3.10 CONFIG REQUIRED)

# One gemm entry point (libmoe/src/backend/cpu/gemm.cpp); OpenBLAS by default, any CBLAS otherwise.
set(BLA_VENDOR OpenBLAS CACHE STRING "BLAS vendor (FindBLAS)")
find_package(BLAS REQUIRED)
find_path(MOE_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu aarch64-linux-gnu REQUIRED)

set(MOE_HAVE_MPI OFF)
if(MOE_MPI)
  find_package(MPI REQUIRED COMPONENTS CXX)
  set(MOE_HAVE_MPI ON)
endif()

# The CUDA backend lands with its own issue; the option and the toolkit detection are here so that
# the build interface does not change when it does.
set(MOE_HAVE_CUDA OFF)
if(MOE_CUDA STREQUAL "ON" OR MOE_CUDA STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    message(STATUS "nvcc found at ${CMAKE_CUDA_COMPILER}; the CUDA backend is not implemented yet, building the CPU backend only")
  elseif(MOE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MOE_CUDA=ON but no CUDA compiler was found")
  endif()
elseif(NOT MOE_CUDA STREQUAL "OFF")
  message(FATAL_ERROR "MOE_CUDA must be AUTO, ON or OFF (got '${MOE_CUDA}')")
endif()

if(MOE_BUILD_TESTS)
  find_package(Catch2 2 CONFIG REQUIRED)
endif()
