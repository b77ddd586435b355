#include "backend/cuda/runtime.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "moe/error.h"
#include "moe/log.h"

namespace moe::cuda {

void throw_call_error(const char* library, const char* statement, const char* message,
                      const char* file, int line) {
  throw Error(str(library, " call failed: ", statement, ": ", message, " [", file, ":", line, "]"));
}

const char* cublas_status_text(cublasStatus_t status) { return cublasGetStatusString(status); }

// ---- devices

namespace {

struct DeviceQuery {
  int count = 0;
  std::string reason;
};

const DeviceQuery& query_devices() {
  static const DeviceQuery q = [] {
    DeviceQuery r;
    cudaError_t err = cudaGetDeviceCount(&r.count);
    if (err != cudaSuccess) {
      r.count = 0;
      r.reason = str("no usable CUDA device: ", cudaGetErrorString(err));
      cudaGetLastError();  // clear the sticky-free error so later queries start clean
    } else if (r.count == 0) {
      r.reason = "no CUDA device is visible";
    }
    return r;
  }();
  return q;
}

void check_device(int device) {
  const DeviceQuery& q = query_devices();
  MOE_CHECK(q.count > 0, q.reason);
  MOE_CHECK(device >= 0 && device < q.count, "CUDA device ", device, " does not exist (", q.count,
            " visible)");
}

}  // namespace

bool built() { return true; }
int device_count() { return query_devices().count; }
std::string unavailable_reason() { return query_devices().reason; }

std::string device_name(int device) {
  check_device(device);
  cudaDeviceProp prop{};
  MOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.1f GiB", static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  return str(prop.name, " (sm_", prop.major, prop.minor, ", ", mem, ")");
}

void use_device(int device) {
  thread_local int current = -1;
  if (current == device) return;
  check_device(device);
  MOE_CUDA_CHECK(cudaSetDevice(device));
  current = device;
}

void set_device(int device) { use_device(device); }

int device_for_local_rank(int local_rank) {
  const int n = device_count();
  MOE_CHECK(n > 0, unavailable_reason());
  if (local_rank >= n) {
    static std::once_flag once;
    std::call_once(once, [&] {
      MOE_LOG_WARN("more ranks on this node than CUDA devices (", n,
                   "): ranks share GPUs, which is slow");
    });
  }
  return local_rank % n;
}

void synchronize(int device) {
  use_device(device);
  MOE_CUDA_CHECK(cudaDeviceSynchronize());
}

// ---- caching allocator

namespace {

size_t round_size(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  if (bytes < (size_t(1) << 20)) return (bytes + 511) / 512 * 512;
  size_t p = 1;
  while (p < bytes) p <<= 1;
  const size_t quarter = p / 8;  // steps of p/8 between p/2 and p
  return (bytes + quarter - 1) / quarter * quarter;
}

class Allocator {
 public:
  std::byte* allocate(size_t size, int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    PerDevice& d = devices_[device];
    auto it = d.free.find(size);
    if (it != d.free.end() && !it->second.empty()) {
      std::byte* p = it->second.back();
      it->second.pop_back();
      d.stats.cached -= size;
      account(d, size);
      return p;
    }
    use_device(device);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cached(device, d);
      err = cudaMalloc(&p, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw Error(str("CUDA out of memory on device ", device, ": cudaMalloc(", size,
                      " bytes) failed (", cudaGetErrorString(err), "); ", d.stats.in_use,
                      " bytes in use, peak ", d.stats.peak_in_use));
    }
    ++d.stats.device_allocations;
    account(d, size);
    return static_cast<std::byte*>(p);
  }

  void release(std::byte* p, size_t size, int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    PerDevice& d = devices_[device];
    d.free[size].push_back(p);
    d.stats.in_use -= size;
    d.stats.cached += size;
  }

  MemoryStats stats(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    return devices_[device].stats;
  }

  void empty() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [device, d] : devices_) release_cached(device, d);
  }

 private:
  struct PerDevice {
    std::map<size_t, std::vector<std::byte*>> free;
    MemoryStats stats;
  };
  static void account(PerDevice& d, size_t size) {
    d.stats.in_use += size;
    d.stats.peak_in_use = std::max(d.stats.peak_in_use, d.stats.in_use);
  }
  static void release_cached(int device, PerDevice& d) {
    use_device(device);
    // Blocks may still be read by queued work; wait for it before giving them back.
    MOE_CUDA_CHECK(cudaDeviceSynchronize());
    for (auto& [size, blocks] : d.free) {
      for (std::byte* p : blocks) MOE_CUDA_CHECK(cudaFree(p));
      d.stats.cached -= size * blocks.size();
      blocks.clear();
    }
  }
  std::mutex mutex_;
  std::map<int, PerDevice> devices_;
};

// Never destroyed: tensors released during static destruction must still find it, and the driver
// frees device memory at process exit.
Allocator& allocator() {
  static Allocator* a = new Allocator;
  return *a;
}

}  // namespace

std::shared_ptr<std::byte> allocate(size_t bytes, int device) {
  const size_t size = round_size(bytes);
  std::byte* p = allocator().allocate(size, device);
  return std::shared_ptr<std::byte>(
      p, [size, device](std::byte* q) { allocator().release(q, size, device); });
}

MemoryStats memory_stats(int device) { return allocator().stats(device); }
void empty_cache() { allocator().empty(); }

std::shared_ptr<std::byte> allocate_pinned(size_t bytes) {
  void* p = nullptr;
  MOE_CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 1)));
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) {
    cudaError_t err = cudaFreeHost(q);
    if (err != cudaSuccess) MOE_LOG_WARN("cudaFreeHost failed: ", cudaGetErrorString(err));
  });
}

// ---- streams and events

Stream::Stream(int device, int priority) : device_(device) {
  use_device(device);
  int least = 0, greatest = 0;
  MOE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  priority = std::clamp(priority, greatest, least);  // greatest is the most negative
  MOE_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
}

Stream::~Stream() {
  if (stream_) cudaStreamDestroy(stream_);
}

void Stream::synchronize() const { MOE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

Event::Event(bool timing) {
  MOE_CUDA_CHECK(
      cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  if (event_) cudaEventDestroy(event_);
}
void Event::record(cudaStream_t stream) { MOE_CUDA_CHECK(cudaEventRecord(event_, stream)); }
void Event::block(cudaStream_t stream) const {
  MOE_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}
void Event::synchronize() const { MOE_CUDA_CHECK(cudaEventSynchronize(event_)); }
bool Event::query() const {
  cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  MOE_CUDA_CHECK(err);
  return true;
}
float Event::elapsed_ms(const Event& start) const {
  float ms = 0;
  MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

namespace {
thread_local std::map<int, cudaStream_t> t_scoped;

cudaStream_t compute_stream(int device) {
  static std::mutex mutex;
  static std::map<int, Stream*>* streams = new std::map<int, Stream*>;  // never destroyed
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams->find(device);
  if (it == streams->end()) it = streams->emplace(device, new Stream(device)).first;
  return it->second->get();
}
}  // namespace

cudaStream_t current_stream(int device) {
  auto it = t_scoped.find(device);
  if (it != t_scoped.end() && it->second) return it->second;
  return compute_stream(device);
}

StreamScope::StreamScope(const Stream& stream) : device_(stream.device()) {
  auto it = t_scoped.find(device_);
  previous_ = it == t_scoped.end() ? nullptr : it->second;
  t_scoped[device_] = stream.get();
}
StreamScope::~StreamScope() { t_scoped[device_] = previous_; }

cublasHandle_t cublas_handle(int device, cudaStream_t stream) {
  static std::mutex mutex;
  static auto* handles = new std::map<std::pair<int, cudaStream_t>, cublasHandle_t>;
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_pair(device, stream);
  auto it = handles->find(key);
  if (it != handles->end()) return it->second;
  use_device(device);
  cublasHandle_t h = nullptr;
  MOE_CUBLAS_CHECK(cublasCreate(&h));
  MOE_CUBLAS_CHECK(cublasSetStream(h, stream));
  MOE_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
  MOE_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  handles->emplace(key, h);
  return h;
}

// ---- copies

void copy_bytes(void* dst, int dst_device, const void* src, int src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device < 0 && src_device < 0) {
    std::copy_n(static_cast<const std::byte*>(src), bytes, static_cast<std::byte*>(dst));
    return;
  }
  const int device = dst_device >= 0 ? dst_device : src_device;
  use_device(device);
  cudaStream_t stream = current_stream(device);
  if (dst_device >= 0 && src_device >= 0) {
    if (dst_device == src_device) {
      MOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    } else {
      // Work queued on the source's stream must finish before the peer copy reads it.
      MOE_CUDA_CHECK(cudaStreamSynchronize(current_stream(src_device)));
      MOE_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, stream));
    }
    return;
  }
  const cudaMemcpyKind kind = dst_device >= 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  MOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void memset_zero(void* dst, int device, size_t bytes) {
  if (bytes == 0) return;
  use_device(device);
  MOE_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, current_stream(device)));
}

}  // namespace moe::cuda
