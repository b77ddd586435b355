// Bump allocator for activations: one step's forward and backward allocate from it, then reset().
// While an ArenaScope is alive on a thread, Tensor::empty/zeros on that thread take their storage
// from the arena. Chunks are never returned to the system, so a tensor kept past reset() reads
// stale data but never freed memory.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

namespace moe {

class Arena {
 public:
  explicit Arena(size_t chunk_bytes = size_t(64) << 20);
  std::shared_ptr<std::byte> allocate(size_t bytes, size_t alignment = 64);
  void reset();
  size_t used_bytes() const { return used_; }
  size_t peak_bytes() const { return peak_; }  // the high-water mark of used_bytes()
  void reset_peak() { peak_ = used_; }         // start a new high-water mark from here
  size_t reserved_bytes() const;

 private:
  struct Chunk {
    std::shared_ptr<std::byte> data;
    size_t size;
  };
  size_t chunk_bytes_;
  std::vector<Chunk> chunks_;
  size_t current_ = 0;  // chunk being filled
  size_t offset_ = 0;   // bytes used in it
  size_t used_ = 0, peak_ = 0;
};

class ArenaScope {
 public:
  explicit ArenaScope(Arena& arena);
  ~ArenaScope();
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;
  static Arena* current();

 private:
  Arena* previous_;
};

// The opposite, for tensors that outlive the arena's reset (ZeRO-3's gathered parameters and
// their gradients, kept across micro-batches): while alive, this thread allocates from the heap.
class HeapScope {
 public:
  HeapScope();
  ~HeapScope();
  HeapScope(const HeapScope&) = delete;
  HeapScope& operator=(const HeapScope&) = delete;

 private:
  Arena* previous_;
};

}  // namespace moe
