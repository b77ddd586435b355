// The device side of the tiered store (offload::TieredStore) when compute runs on a GPU: the
// device slots compute reads, the gradient buffers backward accumulates into, and the copies
// that fill and drain them, ordered by events instead of host waits (the approach of the
// inference ring, offload/expert_ring.cpp). Internal to offload/.
//
// Uploads (host record -> slot): the caller converts an expert's storage values into a pinned
// staging buffer (a small pool: converting one expert overlaps the copy of the previous one),
// and the copy is queued on an upload stream of the store's own, after the slot's `released`
// event (recorded on the compute stream when compute last let go of the slot); a `loaded` event
// recorded after it is waited on by the compute stream in acquire.
//
// Gradients (slot-shaped device buffers, a small pool): a buffer starts as zero or as the
// expert's gradient so far this step (uploaded on the compute stream, under --grad-accum); after
// backward, the download to the buffer's pinned host copy is queued on a download stream after
// an event recorded on the compute stream, and the thread that moves it into the record waits
// for the download's event before reading it.
//
// Host waits happen only where a buffer is reused: a staging buffer whose previous copy is still
// running, a gradient buffer the optimizer thread has not drained yet, and the drain itself.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/backend.h"
#include "moe/device.h"

namespace moe::offload {

class DeviceCopies {
 public:
  // `slots` device slots and `gradient_buffers` gradient buffers of `slot_bytes` each on
  // `device`: a CUDA device (throws naming it when it is not usable), or the CPU, where the
  // copies are synchronous memcpy and events have nothing to order (StoreSettings::stage_on_host:
  // the CPU tests run this path).
  DeviceCopies(Device device, int64_t slot_bytes, int64_t slots, int gradient_buffers);
  ~DeviceCopies();  // waits for the device (its copies read and write the buffers freed here)
  DeviceCopies(const DeviceCopies&) = delete;
  DeviceCopies& operator=(const DeviceCopies&) = delete;

  Device device() const { return device_; }
  const std::shared_ptr<std::byte>& slot(int i) const { return slots_[static_cast<size_t>(i)]; }

  // Fills slot i: `convert` writes the slot's fp32 bytes into a pinned staging buffer (host
  // memory, slot_bytes), then the copy is queued after the slot's release. Thread-safe.
  void upload(int i, const std::function<void(std::byte* staging)>& convert);
  // The compute stream waits (on the device) for slot i's last upload.
  void acquired(int i);
  // Compute's work on slot i so far is queued: the next upload into it waits for that work.
  void released(int i);

  // A free gradient buffer (waits for one the drain has finished with). `initial` (slot layout,
  // slot_bytes) is copied into it on the compute stream; null: it is zeroed there.
  int take_gradient(const std::function<void(std::byte* pinned)>& initial);
  const std::shared_ptr<std::byte>& gradient(int g) const {
    return gradients_[static_cast<size_t>(g)].memory;
  }
  // Backward's work on buffer g is queued: download it (after that work) to its pinned copy.
  void download_gradient(int g);
  // Waits for buffer g's download, hands its pinned host copy (slot layout) to `read`, and frees
  // the buffer (also when `read` throws).
  void drain(int g, const std::function<void(const std::byte* host)>& read);
  void release_gradient(int g);  // frees buffer g (drain does it)

 private:
  struct Staging {
    std::shared_ptr<std::byte> memory;  // pinned
    std::shared_ptr<void> copied;       // event after the copy that last read it
    bool pending = false, busy = false;
  };
  struct Gradient {
    std::shared_ptr<std::byte> memory;  // device
    std::shared_ptr<std::byte> host;    // pinned
    std::shared_ptr<void> computed;     // compute stream: backward's last write
    std::shared_ptr<void> copied;       // download stream: the download finished
    bool busy = false;
  };
  Device device_;
  size_t slot_bytes_;
  const Backend::CopyEngine* engine_;
  std::shared_ptr<void> upload_stream_, download_stream_;
  std::vector<std::shared_ptr<std::byte>> slots_;
  std::vector<std::shared_ptr<void>> released_, loaded_;  // events, per slot
  std::vector<Staging> staging_;
  std::vector<Gradient> gradients_;
  size_t next_staging_ = 0;
  std::mutex mu_;  // guards the busy flags
  std::condition_variable freed_;
};

}  // namespace moe::offload
