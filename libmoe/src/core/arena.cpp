#include "moe/arena.h"

#include <algorithm>

#include "moe/error.h"

namespace moe {
namespace {
thread_local Arena* t_current = nullptr;
}

Arena::Arena(size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}

std::shared_ptr<std::byte> Arena::allocate(size_t bytes, size_t alignment) {
  bytes = std::max<size_t>(bytes, 1);
  while (true) {
    if (current_ < chunks_.size()) {
      Chunk& chunk = chunks_[current_];
      size_t start = (offset_ + alignment - 1) / alignment * alignment;
      if (start + bytes <= chunk.size) {
        offset_ = start + bytes;
        used_ += bytes;
        peak_ = std::max(peak_, used_);
        return std::shared_ptr<std::byte>(chunk.data, chunk.data.get() + start);
      }
      if (current_ + 1 < chunks_.size()) {  // try the next (reused) chunk
        ++current_;
        offset_ = 0;
        continue;
      }
    }
    size_t size = std::max(chunk_bytes_, bytes + alignment);
    std::shared_ptr<std::byte> data(new std::byte[size], std::default_delete<std::byte[]>());
    MOE_CHECK(reinterpret_cast<uintptr_t>(data.get()) % 16 == 0, "arena: misaligned chunk");
    chunks_.push_back({std::move(data), size});
    current_ = chunks_.size() - 1;
    offset_ = 0;
  }
}

void Arena::reset() {
  current_ = 0;
  offset_ = 0;
  used_ = 0;
}

size_t Arena::reserved_bytes() const {
  size_t total = 0;
  for (const Chunk& c : chunks_) total += c.size;
  return total;
}

ArenaScope::ArenaScope(Arena& arena) : previous_(t_current) { t_current = &arena; }
ArenaScope::~ArenaScope() { t_current = previous_; }
Arena* ArenaScope::current() { return t_current; }

HeapScope::HeapScope() : previous_(t_current) { t_current = nullptr; }
HeapScope::~HeapScope() { t_current = previous_; }

}  // namespace moe
