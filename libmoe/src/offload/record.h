// One expert's state as the tiered store keeps it: a record of byte sections (storage value,
// fp32 master when the storage is not f32, AdamW m and v, gradient) for each of the expert's
// tensors, and the tiers that hold records (host memory; the SSD tier behind a host cache).
// Internal to offload/.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "moe/nn/expert_store.h"
#include "moe/offload/cache_policy.h"
#include "moe/offload/expert_file.h"
#include "moe/offload/tiered_store.h"
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
  int field = 0;         // its place in nn::ExpertTensors: w1, w2, w3, b1, b2, b3 = 0..5
  Shape shape;           // [1, ...]: the expert as a group of one
  int64_t elements = 0;  // per expert
  Section value, master, adam_m, adam_v, grad;
  int64_t slot_offset = 0;  // bytes into a device slot (fp32)
};

struct StoreLayout {
  std::vector<TensorLayout> tensors;  // in nn::ExpertTensors order, present ones only
  int64_t record_bytes = 0;           // one expert's state
  int64_t values_bytes = 0;           // the storage values, first in the record: [0, values_bytes)
  int value_sections = 0;             // one per tensor
  int64_t state_bytes = 0;            // all but the gradients, first: [0, state_bytes)
  int state_sections = 0;             // the sections in it (the gradients follow, one per tensor)
  int64_t slot_bytes = 0;             // one expert's fp32 weights
  RecordLayout file;                  // the same sections as the SSD tier's files name them
};

// The layout of one layer's experts (all experts of a layer share it); `storage`: the
// parameters' dtype.
StoreLayout record_layout(const nn::ExpertParams& params, DType storage);

// A typed view into a record or slot held alive by `base` (memory on `device`).
Tensor view(const std::shared_ptr<std::byte>& base, int64_t offset, const Shape& shape, DType dtype,
            Device device = {});

// One expert's AdamW step on its record (pinned by the caller): zero a stale gradient, apply the
// clip scale, update master, m and v, round into the storage value; then check the new values
// are finite (moe::Error naming the step and the expert). Bitwise optim::AdamW::step on the
// expert's slice: the same element-wise kernel (ops::adamw_update) and conversions.
struct RecordUpdate {
  const optim::AdamWConfig* adamw = nullptr;
  float lr = 0;
  int64_t adam_step = 1;
  float clip_scale = 1.0f;
  bool stale_gradient = false;
};
void adamw_record(const StoreLayout& layout, const std::shared_ptr<std::byte>& record,
                  int64_t expert, const RecordUpdate& u);

// What an unpin says of the record. clean: nothing changed. dirty: anything may have changed,
// and its gradient is live (backward wrote it; the update will read it). spent: an update read
// the gradient and changed the state; the gradient's bytes are dead until the next backward
// writes them (it zeroes them first), so a cache need not write them back nor read them again.
enum class Dirty { clean, dirty, spent };

// Where records live. pin() returns the record's bytes and keeps them in memory until the
// matching unpin(); a cache writes back what an unpin marked changed before dropping it.
// Different experts may be pinned from different threads at once.
class RecordTier {
 public:
  virtual ~RecordTier() = default;
  // fresh: the caller overwrites the whole record (nothing is read).
  virtual std::shared_ptr<std::byte> pin(int layer, int64_t expert, bool fresh = false) = 0;
  virtual void unpin(int layer, int64_t expert, Dirty dirty) = 0;
  virtual void end_step() {}
  // The record's first `bytes` bytes (its storage values) into `into` (at least `bytes` long),
  // for an upload: the SSD tier reads only those sections when the record is not in memory.
  virtual void read_values(int layer, int64_t expert, int64_t bytes, std::byte* into);
  // The whole record will be pinned soon (backward: gradients(), then its update): bring it into
  // memory now, on the caller's thread (the store's loader), so that pin finds it there. Nothing
  // to do when every record is in memory.
  virtual void prefetch(int /*layer*/, int64_t /*expert*/) {}
  virtual int64_t resident_bytes() const = 0;  // host memory the tier holds
};

// Every record in host memory, one allocation per layer.
class HostRecords final : public RecordTier {
 public:
  HostRecords(const std::vector<int64_t>& experts_per_layer,
              const std::vector<int64_t>& record_bytes);
  std::shared_ptr<std::byte> pin(int layer, int64_t expert, bool fresh = false) override;
  void unpin(int, int64_t, Dirty) override {}
  int64_t resident_bytes() const override { return bytes_; }

 private:
  std::vector<std::shared_ptr<std::byte>> layers_;
  std::vector<int64_t> record_bytes_;
  int64_t bytes_ = 0;
};

// Records on the SSD tier (ExpertFiles) behind a bounded host cache of `capacity` records
// (ExpertCache: LRU or the MoESys LFU variant). A miss reads the expert's file into the slot the
// cache gives it, after writing back the dirty record it displaces; a bypass (no evictable slot)
// serves the record from a private buffer, written back at its unpin when dirty. A record whose
// gradient is spent (Dirty::spent, and no dirty unpin since) moves without it: written back as
// its state prefix, read back with the gradient zeroed (MoESys's 12 bytes per parameter on the
// SSD rather than 16). Thread-safe: one record is read or written back by one thread at a time,
// others wait for it.
class CachedRecords final : public RecordTier {
 public:
  // How each layer's records split (from its StoreLayout).
  struct Spans {
    int value_sections = 0;  // the first sections: the storage values
    int state_sections = 0;  // the first sections: everything but the gradients
    int64_t state_bytes = 0, record_bytes = 0;
  };
  CachedRecords(std::unique_ptr<ExpertFiles> files, const CacheConfig& cache, int64_t slot_bytes,
                std::vector<Spans> spans);
  std::shared_ptr<std::byte> pin(int layer, int64_t expert, bool fresh = false) override;
  void unpin(int layer, int64_t expert, Dirty dirty) override;
  void read_values(int layer, int64_t expert, int64_t bytes, std::byte* into) override;
  // Pins and unpins the record (a cache access: it counts for the policy like any other).
  void prefetch(int layer, int64_t expert) override;
  void end_step() override;
  int64_t resident_bytes() const override;
  CacheStats cache_stats() const;
  const ExpertFiles& files() const { return *files_; }

 private:
  template <class Io>
  void unlocked(std::unique_lock<std::mutex>& lock, const ExpertKey& key, Io&& io);
  void write_back(std::unique_lock<std::mutex>& lock, const ExpertKey& key, const std::byte* data);
  void read_in(std::unique_lock<std::mutex>& lock, const ExpertKey& key, std::byte* data);
  uint8_t& spent(const ExpertKey& key);
  std::unique_ptr<ExpertFiles> files_;
  ExpertCache cache_;
  int64_t slot_bytes_;
  std::vector<Spans> spans_;
  // [L][E]: the record's gradient is dead (its last unpin that changed it said spent), in
  // whichever copy is current, cached or on file; true before the first write.
  std::vector<std::vector<uint8_t>> spent_;
  std::vector<std::shared_ptr<std::byte>> slots_;
  std::set<ExpertKey> busy_;  // being read or written back: others wait
  struct Bypassed {
    std::shared_ptr<std::byte> data;
    int pins = 0;
    bool dirty = false;
  };
  std::map<ExpertKey, Bypassed> bypassed_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
};

// The tier a store's config names: HostRecords (refused when --host-budget is set and too small),
// or CachedRecords over ExpertFiles in ssd_dir behind a cache of host_budget bytes (by default a
// quarter of the experts' state). layouts[l] and experts[l]: layer l's record layout and experts.
std::unique_ptr<RecordTier> make_record_tier(const StoreConfig& config,
                                             const std::vector<const StoreLayout*>& layouts,
                                             const std::vector<int64_t>& experts);

// 64-byte aligned host bytes (not from an arena).
std::shared_ptr<std::byte> allocate_host(int64_t bytes);

}  // namespace moe::offload
