// Tensor: shape, dtype, device, name; row-major and contiguous; owning or a view of shared storage.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "moe/device.h"
#include "moe/dtype.h"
#include "moe/error.h"

namespace moe {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised storage (from the current ArenaScope's arena when one is active).
  static Tensor empty(Shape shape, DType dtype = DType::f32, Device device = {});
  static Tensor zeros(Shape shape, DType dtype = DType::f32, Device device = {});
  static Tensor from_vector(Shape shape, const std::vector<float>& values);
  static Tensor from_vector(Shape shape, const std::vector<int32_t>& values);
  // A tensor over storage the caller allocated (pinned host buffers, say), which must hold at
  // least shape x dtype bytes on `device`; the tensor shares its ownership.
  static Tensor from_storage(std::shared_ptr<std::byte> storage, Shape shape, DType dtype,
                             Device device = {});

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  const std::string& name() const { return name_; }
  Tensor& set_name(std::string name) {
    name_ = std::move(name);
    return *this;
  }
  // "name[2,3] f32 cpu" for error messages.
  std::string describe() const;

  // Storage pointers: device pointers for CUDA tensors (for kernels; host code must not read them).
  void* raw() { return storage_.get(); }
  const void* raw() const { return storage_.get(); }
  template <class T>
  T* data() {
    check_type(dtype_of<T>());
    return reinterpret_cast<T*>(storage_.get());
  }
  template <class T>
  const T* data() const {
    check_type(dtype_of<T>());
    return reinterpret_cast<const T*>(storage_.get());
  }
  // Raw 16-bit storage of bf16/f16 tensors.
  uint16_t* half_bits();
  const uint16_t* half_bits() const;

  // Views sharing storage.
  Tensor reshape(Shape shape) const;
  Tensor rows(int64_t begin, int64_t end) const;  // slice of the first dimension
  // The same bytes as `dtype`, which must have this dtype's element size (u8 rows of a block
  // format as that format's dtype, say).
  Tensor view_as(DType dtype) const;

  // Copies.
  Tensor clone() const;
  Tensor to(DType dtype) const;          // converts (round-to-nearest-even for bf16/f16)
  Tensor to(Device device) const;        // a copy on `device` (this tensor when already there)
  std::vector<float> to_vector() const;  // any floating dtype, as f32, from any device
  void copy_from(const Tensor& other);   // same shape; converts dtype
  void fill(float value);
  void zero();

  // Throws moe::Error naming this tensor when its shape differs.
  void expect_shape(const Shape& expected, const char* what = nullptr) const;
  void expect_dtype(DType expected, const char* what = nullptr) const;

 private:
  void check_type(DType requested) const;
  std::shared_ptr<std::byte> storage_;
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_{};
  std::string name_;
};

}  // namespace moe
