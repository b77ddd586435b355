# Every dependency comes from a Debian package or the CUDA toolkit; scripts/setup installs them.
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json 3.10 CONFIG REQUIRED)

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
