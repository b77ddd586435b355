// The CUDA backend's runtime: the caching device allocator, pinned host buffers, streams and events
// (RAII), the stream ops run on, cuBLAS handles per (device, stream), and copies. Host code only
// (compiled by the host compiler); kernels live in the .cu files next to it.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include "backend/cuda/check.h"
#include "moe/cuda.h"
#include "moe/tensor.h"

namespace moe::cuda {

// Device memory from the caching allocator: sizes are rounded up (512 B granularity below 1 MiB,
// then quarter powers of two), freed blocks go to a per-device free list and are reused for the
// same rounded size; cudaMalloc is called only when the list is empty, and on out-of-memory the
// cache is returned to the driver and the call retried once. Never managed memory.
// Stream semantics: a block freed on the host may still be read by work queued on the compute
// stream; it is safe to reuse from that same stream (work is ordered). Work on another stream must
// record an event and make the compute stream wait on it before the block is dropped.
std::shared_ptr<std::byte> allocate(size_t bytes, int device);

// Page-locked host memory (cudaMallocHost), for staging buffers that copies overlap with compute.
std::shared_ptr<std::byte> allocate_pinned(size_t bytes);

class Stream {
 public:
  // priority: 0 normal; negative = higher (cudaDeviceGetStreamPriorityRange clamps it).
  explicit Stream(int device, int priority = 0);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
};

class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t stream);
  // Makes `stream` wait (on the device) for the work recorded before this event.
  void block(cudaStream_t stream) const;
  void synchronize() const;
  bool query() const;  // true once the recorded work finished
  float elapsed_ms(const Event& start) const;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// The stream ops on `device` enqueue on: the StreamScope of this thread when one is active for that
// device, else the device's compute stream (non-blocking, created on first use).
cudaStream_t current_stream(int device);
class StreamScope {
 public:
  explicit StreamScope(const Stream& stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
};

// cuBLAS handle bound to (device, stream), created on first use and kept; pointer mode host,
// tensor-op math off (fp32 GEMMs stay IEEE fp32 so results compare with the CPU backend).
cublasHandle_t cublas_handle(int device, cudaStream_t stream);

// Makes `device` current on this thread (cheap when it already is).
void use_device(int device);

// The stream ops on a device tensor enqueue on, with its device made current.
inline cudaStream_t stream_of(const Tensor& t) {
  use_device(t.device().index);
  return current_stream(t.device().index);
}

// Copies of `bytes` between host (device < 0) and device memory, ordered on current_stream of the
// device involved. Host-to-device and device-to-host calls return when the copy finished (the host
// buffer may be reused at once); device-to-device is asynchronous on the stream.
void copy_bytes(void* dst, int dst_device, const void* src, int src_device, size_t bytes);
void memset_zero(void* dst, int device, size_t bytes);

}  // namespace moe::cuda
