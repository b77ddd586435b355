// One expert's state as the tiered store keeps it: a record of byte sections (storage value,
// fp32 master when the storage is not f32, AdamW m and v, gradient) for each of the expert's
// tensors, and the tiers that hold records (host memory; the SSD tier behind a host cache).
// Internal to offload/.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe/nn/expert_store.h"
#include "moe/tensor.h"

namespace moe::offload {

inline constexpr int64_t kSectionAlign = 64;

struct Section {
  int64_t offset = -1;  // bytes into the record; -1: absent (master of an f32 parameter)
  DType dtype = DType::f32;
};

// One of the expert's tensors (w1, w2, w3, b1, b2) in the record and in a device slot.
struct TensorLayout {
  Param* param = nullptr;
  Shape shape;           // [1, ...]: the expert as a group of one
  int64_t elements = 0;  // per expert
  Section value, master, adam_m, adam_v, grad;
  int64_t slot_offset = 0;  // bytes into a device slot (fp32)
};

struct RecordLayout {
  std::vector<TensorLayout> tensors;  // in nn::ExpertTensors order, present ones only
  int64_t record_bytes = 0;           // one expert's state
  int64_t slot_bytes = 0;             // one expert's fp32 weights
};

// The layout of one layer's experts (all experts of a layer share it); `storage`: the
// parameters' dtype.
RecordLayout record_layout(const nn::ExpertParams& params, DType storage);

// A typed view into a record or slot held alive by `base`.
Tensor view(const std::shared_ptr<std::byte>& base, int64_t offset, const Shape& shape,
            DType dtype);

// Where records live. pin() returns the record's bytes and keeps them in memory until the
// matching unpin(); `dirty` says the record changed (a cache writes it back before dropping it).
// Different experts may be pinned from different threads at once.
class RecordTier {
 public:
  virtual ~RecordTier() = default;
  virtual std::shared_ptr<std::byte> pin(int layer, int64_t expert) = 0;
  virtual void unpin(int layer, int64_t expert, bool dirty) = 0;
  // A hint that the record will be pinned soon (the SSD tier reads it ahead).
  virtual void prefetch(int /*layer*/, int64_t /*expert*/) {}
  virtual void flush() {}
  virtual int64_t resident_bytes() const = 0;  // host memory the tier holds
};

// Every record in host memory, one allocation per layer.
class HostRecords final : public RecordTier {
 public:
  HostRecords(const std::vector<int64_t>& experts_per_layer,
              const std::vector<int64_t>& record_bytes);
  std::shared_ptr<std::byte> pin(int layer, int64_t expert) override;
  void unpin(int, int64_t, bool) override {}
  int64_t resident_bytes() const override { return bytes_; }

 private:
  std::vector<std::shared_ptr<std::byte>> layers_;
  std::vector<int64_t> record_bytes_;
  int64_t bytes_ = 0;
};

// 64-byte aligned host bytes (not from an arena).
std::shared_ptr<std::byte> allocate_host(int64_t bytes);

}  // namespace moe::offload
