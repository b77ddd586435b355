#include "moe/device.h"

#include "moe/cuda.h"
#include "moe/error.h"

namespace moe {

std::string Device::str() const {
  return kind == cpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device Device::parse(const std::string& text) {
  if (text == "cpu") return {cpu, 0};
  if (text == "cuda") return {cuda, 0};
  if (text.rfind("cuda:", 0) == 0) {
    try {
      return {cuda, std::stoi(text.substr(5))};
    } catch (const std::exception&) {
    }
  }
  throw UsageError(moe::str("unknown device '", text, "' (expected cpu, cuda or cuda:N)"));
}

bool backend_available(Device::Kind kind) { return kind == Device::cpu || cuda::available(); }

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
MemoryStats memory_stats(int) { return {}; }
void empty_cache() {}
}  // namespace cuda
#endif

}  // namespace moe
