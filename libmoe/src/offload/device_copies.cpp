// The tiered store's device slots, gradient buffers and their copies (see device_copies.h).
#include "offload/device_copies.h"

#include <cstring>

#include "moe/cuda.h"
#include "moe/error.h"
#include "moe/log.h"
#include "offload/record.h"

namespace moe::offload {

namespace {
// Pinned staging buffers: two let converting one expert overlap the copy of the previous one; a
// third lets an upload on the compute thread (an expert the loader did not prefetch) proceed
// while the loader holds two.
constexpr int kStagingBuffers = 3;

// The CPU's stand-in for a copy engine: host buffers, synchronous copies (so streams and events
// have nothing to order). Compute on the CPU has finished when it returns, so a copy made at once
// is ordered exactly as the events order it on a GPU.
const Backend::CopyEngine& host_copies() {
  static const Backend::CopyEngine engine{
      [](size_t bytes) { return allocate_host(static_cast<int64_t>(bytes)); },
      [](int) -> std::shared_ptr<void> { return std::make_shared<int>(0); },
      [](int) -> std::shared_ptr<void> { return std::make_shared<int>(0); },
      [](void*, void*, int) {},
      [](void*, void*, int) {},
      [](void*) {},
      [](void*) {},
      [](void* dst, const void* src, size_t bytes, void*, int) { std::memcpy(dst, src, bytes); },
      [](void* dst, const void* src, size_t bytes, void*, int) { std::memcpy(dst, src, bytes); }};
  return engine;
}
}  // namespace

DeviceCopies::DeviceCopies(Device device, int64_t slot_bytes, int64_t slots, int gradient_buffers)
    : device_(device), slot_bytes_(static_cast<size_t>(slot_bytes)) {
  if (device.kind != Device::cpu) {
    // Without the backend cuda::available() is false too, and unavailable_reason() says why.
    MOE_CHECK(cuda::available(), "expert store: device ", device.str(), ": ",
              cuda::unavailable_reason());
    MOE_CHECK(device.index >= 0 && device.index < cuda::device_count(), "expert store: device ",
              device.str(), " does not exist (", cuda::device_count(), " CUDA devices visible)");
  }
  const Backend& backend = backend_for(device);
  engine_ = device.kind == Device::cpu ? &host_copies() : &backend.copy_engine;
  const int index = device.index;
  upload_stream_ = engine_->create_stream(index);
  download_stream_ = engine_->create_stream(index);
  for (int64_t i = 0; i < slots; ++i) {
    slots_.push_back(backend.memory.allocate(slot_bytes_, index));
    released_.push_back(engine_->create_event(index));
    loaded_.push_back(engine_->create_event(index));
    // Whatever the allocator's block last served is queued on the compute stream: the first
    // upload into the slot waits for it.
    engine_->record(released_.back().get(), nullptr, index);
  }
  staging_.resize(kStagingBuffers);
  for (Staging& s : staging_) {
    s.memory = engine_->allocate_pinned(slot_bytes_);
    s.copied = engine_->create_event(index);
  }
  gradients_.resize(static_cast<size_t>(gradient_buffers));
  for (Gradient& g : gradients_) {
    g.memory = backend.memory.allocate(slot_bytes_, index);
    g.host = engine_->allocate_pinned(slot_bytes_);
    g.computed = engine_->create_event(index);
    g.copied = engine_->create_event(index);
  }
}

DeviceCopies::~DeviceCopies() {
  // Queued copies read the pinned buffers and write the slots and gradient buffers, on the
  // store's streams and (a gradient's upload) on the compute stream: all of the device's work.
  if (device_.kind != Device::cuda) return;
  try {
    cuda::synchronize(device_.index);
  } catch (const std::exception& e) {
    MOE_LOG_WARN("expert store: ", e.what());
  }
}

void DeviceCopies::upload(int i, const std::function<void(std::byte* staging)>& convert) {
  size_t b = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    freed_.wait(lock, [&] {
      for (size_t n = 0; n < staging_.size(); ++n)
        if (!staging_[(next_staging_ + n) % staging_.size()].busy) {
          b = (next_staging_ + n) % staging_.size();
          return true;
        }
      return false;
    });
    staging_[b].busy = true;
    next_staging_ = (b + 1) % staging_.size();
  }
  Staging& s = staging_[b];
  auto give_back = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    s.busy = false;
    freed_.notify_all();
  };
  try {
    if (s.pending) engine_->synchronize_event(s.copied.get());  // its previous copy read it
    s.pending = false;
    convert(s.memory.get());
    const int index = device_.index;
    void* stream = upload_stream_.get();
    const size_t slot = static_cast<size_t>(i);
    engine_->wait(released_[slot].get(), stream, index);
    engine_->copy_to_device_async(slots_[slot].get(), s.memory.get(), slot_bytes_, stream, index);
    engine_->record(s.copied.get(), stream, index);
    s.pending = true;
    engine_->record(loaded_[slot].get(), stream, index);
  } catch (...) {
    give_back();
    throw;
  }
  give_back();
}

void DeviceCopies::acquired(int i) {
  engine_->wait(loaded_[static_cast<size_t>(i)].get(), nullptr, device_.index);
}

void DeviceCopies::released(int i) {
  engine_->record(released_[static_cast<size_t>(i)].get(), nullptr, device_.index);
}

int DeviceCopies::take_gradient(const std::function<void(std::byte* pinned)>& initial) {
  size_t g = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    freed_.wait(lock, [&] {
      for (size_t n = 0; n < gradients_.size(); ++n)
        if (!gradients_[n].busy) {
          g = n;
          return true;
        }
      return false;
    });
    gradients_[g].busy = true;
  }
  Gradient& buffer = gradients_[g];
  const int index = device_.index;
  try {
    // Its last download has been read on the host (release_gradient), so this wait is free; it
    // keeps the order explicit on the device.
    engine_->wait(buffer.copied.get(), nullptr, index);
    if (initial) {
      initial(buffer.host.get());
      engine_->copy_to_device_async(buffer.memory.get(), buffer.host.get(), slot_bytes_, nullptr,
                                    index);
    } else {
      Tensor memory = Tensor::from_storage(
          buffer.memory, {static_cast<int64_t>(slot_bytes_ / sizeof(float))}, DType::f32, device_);
      memory.zero();  // on the compute stream, before backward's accumulation
    }
  } catch (...) {
    release_gradient(static_cast<int>(g));
    throw;
  }
  return static_cast<int>(g);
}

void DeviceCopies::download_gradient(int g) {
  Gradient& buffer = gradients_[static_cast<size_t>(g)];
  const int index = device_.index;
  void* stream = download_stream_.get();
  engine_->record(buffer.computed.get(), nullptr, index);
  engine_->wait(buffer.computed.get(), stream, index);
  engine_->copy_to_host_async(buffer.host.get(), buffer.memory.get(), slot_bytes_, stream, index);
  engine_->record(buffer.copied.get(), stream, index);
}

void DeviceCopies::drain(int g, const std::function<void(const std::byte* host)>& read) {
  struct Release {
    DeviceCopies* copies;
    int g;
    ~Release() { copies->release_gradient(g); }
  } release{this, g};
  Gradient& buffer = gradients_[static_cast<size_t>(g)];
  engine_->synchronize_event(buffer.copied.get());
  read(buffer.host.get());
}

void DeviceCopies::release_gradient(int g) {
  std::lock_guard<std::mutex> lock(mu_);
  gradients_[static_cast<size_t>(g)].busy = false;
  freed_.notify_all();
}

}  // namespace moe::offload
