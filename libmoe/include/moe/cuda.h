// CUDA devices as the rest of the library sees them. Every function here exists in every build:
// without the CUDA backend (or without a usable GPU and driver) device_count() is 0 and the others
// throw moe::Error saying so, so tools can refuse `--device cuda` with a clear message.
#pragma once
#include <cstddef>
#include <string>

namespace moe::cuda {

// True when this library was built with the CUDA backend (MOE_CUDA=AUTO found nvcc, or ON).
bool built();
// Usable CUDA devices: 0 without the backend, without a driver, or without a GPU.
int device_count();
inline bool available() { return device_count() > 0; }
// Why no device is usable ("built without CUDA", the driver's error text, ...); empty when one is.
std::string unavailable_reason();
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)".
std::string device_name(int device);
// Makes `device` current on the calling thread; throws when it does not exist.
void set_device(int device);
// The device a rank uses under a launcher: local_rank modulo the devices it sees (several ranks
// per GPU are allowed but slow; a message says so once).
int device_for_local_rank(int local_rank);
// Waits for all work on the device.
void synchronize(int device);

// How many streams the grouped expert GEMM spreads its per-expert cuBLAS calls over (1 to 16;
// default 4; 1 runs them one after the other on the calling stream). The bits do not depend on it.
void set_expert_streams(int streams);
int expert_streams();

// The caching device allocator's counters (bytes).
struct MemoryStats {
  size_t in_use = 0, cached = 0, peak_in_use = 0, device_allocations = 0;
};
MemoryStats memory_stats(int device);
// Returns the cached (free) blocks of every device to the driver.
void empty_cache();

}  // namespace moe::cuda
