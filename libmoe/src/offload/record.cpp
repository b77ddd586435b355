// Record layouts and the host-memory record tier (see record.h).
#include "offload/record.h"

#include <cstdlib>
#include <new>

#include "moe/error.h"

namespace moe::offload {

static int64_t aligned(int64_t bytes) {
  return (bytes + kSectionAlign - 1) / kSectionAlign * kSectionAlign;
}

RecordLayout record_layout(const nn::ExpertParams& params, DType storage) {
  RecordLayout layout;
  for (Param* p : {params.w1, params.w2, params.w3, params.b1, params.b2}) {
    if (!p) continue;
    TensorLayout t;
    t.param = p;
    t.shape = p->shape;
    t.shape[0] = 1;
    t.elements = shape_numel(t.shape);
    layout.tensors.push_back(std::move(t));
  }
  int64_t at = 0, slot = 0;
  auto place = [&](Section& s, DType dtype, int64_t elements) {
    s.offset = at;
    s.dtype = dtype;
    at += aligned(elements * static_cast<int64_t>(dtype_size(dtype)));
  };
  for (TensorLayout& t : layout.tensors) {
    place(t.value, storage, t.elements);
    if (storage != DType::f32) place(t.master, DType::f32, t.elements);
    place(t.adam_m, DType::f32, t.elements);
    place(t.adam_v, DType::f32, t.elements);
    place(t.grad, DType::f32, t.elements);
    t.slot_offset = slot;
    slot += aligned(t.elements * 4);
  }
  layout.record_bytes = at;
  layout.slot_bytes = slot;
  return layout;
}

Tensor view(const std::shared_ptr<std::byte>& base, int64_t offset, const Shape& shape,
            DType dtype) {
  return Tensor::from_storage(std::shared_ptr<std::byte>(base, base.get() + offset), shape, dtype);
}

std::shared_ptr<std::byte> allocate_host(int64_t bytes) {
  const size_t size = static_cast<size_t>(aligned(std::max<int64_t>(bytes, 1)));
  void* p = std::aligned_alloc(kSectionAlign, size);
  if (!p) throw Error(str("expert store: cannot allocate ", bytes, " bytes of host memory"));
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

HostRecords::HostRecords(const std::vector<int64_t>& experts_per_layer,
                         const std::vector<int64_t>& record_bytes)
    : record_bytes_(record_bytes) {
  for (size_t l = 0; l < experts_per_layer.size(); ++l) {
    const int64_t bytes = experts_per_layer[l] * record_bytes[l];
    layers_.push_back(allocate_host(bytes));
    bytes_ += bytes;
  }
}

std::shared_ptr<std::byte> HostRecords::pin(int layer, int64_t expert) {
  const auto& base = layers_.at(static_cast<size_t>(layer));
  return std::shared_ptr<std::byte>(
      base, base.get() + expert * record_bytes_[static_cast<size_t>(layer)]);
}

}  // namespace moe::offload
