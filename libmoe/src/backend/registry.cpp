// The backend registry: which op table serves which device kind. The CPU table is always here; the
// CUDA one when the library was built with the CUDA backend. This file and backend/cuda/ are the
// only places that know whether that happened (MOE_HAVE_CUDA); without it the functions of
// moe/cuda.h are the stubs below, so every build has every symbol.
#include "backend/cpu/backend.h"
#include "core/backend.h"
#include "moe/cuda.h"
#include "moe/error.h"
#ifdef MOE_HAVE_CUDA
#include "backend/cuda/backend.h"
#endif

namespace moe {

const Backend* find_backend(Device::Kind kind) {
  switch (kind) {
    case Device::cpu:
      return &cpu::table();
    case Device::cuda:
#ifdef MOE_HAVE_CUDA
      return &cuda::table();
#else
      return nullptr;
#endif
  }
  return nullptr;
}

const Backend& backend_for(Device device) {
  if (device.kind == Device::cpu) return cpu::table();
  const Backend* table = find_backend(device.kind);
  if (!table || !backend_available(device.kind))
    throw Error(str("no backend for ", device.str(), ": ", cuda::unavailable_reason()));
  return *table;
}

#ifndef MOE_HAVE_CUDA
// Without the CUDA backend there is no CUDA device; backend/cuda/runtime.cpp has the real ones.
namespace cuda {
namespace {
[[noreturn]] void no_cuda() { throw Error(unavailable_reason()); }
}  // namespace
bool built() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() {
  return "this build has no CUDA backend (configure with nvcc available, or -DMOE_CUDA=ON)";
}
std::string device_name(int) { no_cuda(); }
void set_device(int) { no_cuda(); }
int device_for_local_rank(int) { no_cuda(); }
void synchronize(int) { no_cuda(); }
void set_expert_streams(int) {}
int expert_streams() { return 1; }
MemoryStats memory_stats(int) { return {}; }
void empty_cache() {}
}  // namespace cuda
#endif

}  // namespace moe
