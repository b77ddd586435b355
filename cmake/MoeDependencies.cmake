# Every dependency comes from a Debian package or the CUDA toolkit; scripts/setup installs them.
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json 3.10 CONFIG REQUIRED)
find_package(tomlplusplus 3 CONFIG REQUIRED)  # --tasks files (libmoe/src/train/tasks.cpp)
# Tokenizers (libmoe/src/io/tokenizer*.cpp): PCRE2 runs tokenizer.json's pre-tokenizer
# expressions, ICU its NFC normaliser, libsentencepiece reads tokenizer.model.
find_package(PkgConfig REQUIRED)
pkg_check_modules(MOE_PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(MOE_SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
find_package(ICU REQUIRED COMPONENTS uc)

# One gemm entry point (libmoe/src/backend/cpu/gemm.cpp); OpenBLAS by default, any CBLAS otherwise.
# Debian's OpenMP build of OpenBLAS is preferred: it shares libgomp's thread pool with our OpenMP
# loops. With the pthreads build the two pools spin against each other on few cores (measured:
# 61% of a training step in libgomp's spin-wait on 2 cores; see docs/PERFORMANCE.md).
# -DMOE_BLAS_LIBRARY=/path/to/libcblas.so swaps in another CBLAS.
find_library(MOE_BLAS_LIBRARY NAMES openblas DOC "CBLAS library to link"
  PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp NO_DEFAULT_PATH)
if(NOT MOE_BLAS_LIBRARY)
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS REQUIRED)
  set(MOE_BLAS_LIBRARY ${BLAS_LIBRARIES})
  message(WARNING "OpenMP build of OpenBLAS not found (Debian: libopenblas-openmp-dev); using ${MOE_BLAS_LIBRARY}")
endif()
set(BLAS_LIBRARIES ${MOE_BLAS_LIBRARY})
find_path(MOE_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu aarch64-linux-gnu REQUIRED)
# The OpenMP build lives outside the linker's default path: keep it in the installed RPATH too.
set(CMAKE_INSTALL_RPATH_USE_LINK_PATH ON)

# MPI (MPICH from Debian): the communicator of distributed runs. MOE_MPI=ON requires it (scripts/setup
# installs it); -DMOE_MPI=OFF builds the launcher-free local communicator only. The C bindings are
# used from C++: MPICH's deprecated C++ bindings are kept out.
set(MOE_HAVE_MPI OFF)
if(MOE_MPI)
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI COMPONENTS CXX)
  if(NOT MPI_CXX_FOUND)
    message(FATAL_ERROR "MOE_MPI=ON but no MPI was found: install it (Debian: apt-get install mpich libmpich-dev, or run scripts/setup) or configure with -DMOE_MPI=OFF")
  endif()
  if(NOT MPIEXEC_EXECUTABLE)
    message(FATAL_ERROR "MOE_MPI=ON but no mpiexec was found (Debian: mpich)")
  endif()
  set(MOE_HAVE_MPI ON)
endif()

# CUDA backend (libmoe/src/backend/cuda, comm/nccl): on when nvcc is found (AUTO) or required
# (ON). Kernels are built for sm_80 (A100) and sm_90 (H100) as SASS, plus compute_90 PTX for newer
# GPUs; -DCMAKE_CUDA_ARCHITECTURES=... overrides. cuBLAS and NCCL come with the toolkit.
set(MOE_HAVE_CUDA OFF)
if(MOE_CUDA STREQUAL "ON" OR MOE_CUDA STREQUAL "AUTO")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90)
    endif()
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc's C++20 dialect (nvcc has it since 12.0); the headers the
    # kernels share with the host code are C++20, so it is declared here.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
      list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(CMAKE_CUDA_EXTENSIONS OFF)
    find_package(CUDAToolkit REQUIRED)
    find_path(MOE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/include)
    find_library(MOE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/lib)
    if(NOT MOE_NCCL_INCLUDE_DIR OR NOT MOE_NCCL_LIBRARY)
      message(FATAL_ERROR "CUDA found but NCCL (nccl.h, libnccl) was not; install NCCL or configure with -DMOE_CUDA=OFF")
    endif()
    set(MOE_HAVE_CUDA ON)
    message(STATUS "CUDA backend: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}, NCCL ${MOE_NCCL_LIBRARY}")
  elseif(MOE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MOE_CUDA=ON but no CUDA compiler was found (set CUDACXX or put nvcc on PATH)")
  endif()
elseif(NOT MOE_CUDA STREQUAL "OFF")
  message(FATAL_ERROR "MOE_CUDA must be AUTO, ON or OFF (got '${MOE_CUDA}')")
endif()

if(MOE_BUILD_TESTS)
  find_package(Catch2 2 CONFIG REQUIRED)
endif()
