#include "moe/tensor.h"

#include <cstring>

#include "core/backend.h"
#include "moe/cuda.h"
#include "moe/step_breakdown.h"

namespace moe {

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  s += ']';
  return s;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  const PartScope part(StepPart::memory);
  for (int64_t d : shape)
    MOE_CHECK(d >= 0, "tensor: negative dimension in shape ", shape_str(shape));
  MOE_CHECK(backend_available(device.kind), "tensor: no backend for ", device.str(), ": ",
            cuda::unavailable_reason());
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  size_t bytes = std::max<size_t>(t.nbytes(), 1);
  // Host tensors come from the current ArenaScope's arena when one is active; device tensors from
  // the device's own allocator (CUDA's caching allocator already recycles a step's blocks).
  t.storage_ = backend_for(device).memory.allocate(bytes, device.index);
  return t;
}

Tensor Tensor::from_storage(std::shared_ptr<std::byte> storage, Shape shape, DType dtype,
                            Device device) {
  for (int64_t d : shape)
    MOE_CHECK(d >= 0, "tensor: negative dimension in shape ", shape_str(shape));
  MOE_CHECK(storage != nullptr, "tensor: no storage for a tensor of shape ", shape_str(shape));
  Tensor t;
  t.storage_ = std::move(storage);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  t.zero();
  return t;
}

namespace {
// Copies the bytes of equally sized tensors between any devices: the table of the side that is not
// the host does it (the CPU's when both are).
void copy_storage(Tensor& dst, const Tensor& src) {
  const Device::Kind kind =
      dst.device().kind != Device::cpu ? dst.device().kind : src.device().kind;
  const Backend* table = find_backend(kind);
  if (!table)
    throw Error(str("copy into ", dst.describe(), " from ", src.describe(), ": no CUDA backend"));
  table->memory.copy(dst, src);
}
}  // namespace

Tensor Tensor::to(Device device) const {
  if (device == device_) return *this;
  Tensor t = empty(shape_, dtype_, device);
  copy_storage(t, *this);
  t.name_ = name_;
  return t;
}

Tensor Tensor::from_vector(Shape shape, const std::vector<float>& values) {
  Tensor t = empty(std::move(shape), DType::f32);
  MOE_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "from_vector: ", values.size(),
            " values for shape ", shape_str(t.shape()));
  if (t.nbytes() > 0) std::memcpy(t.raw(), values.data(), t.nbytes());  // empty: no pointers
  return t;
}

Tensor Tensor::from_vector(Shape shape, const std::vector<int32_t>& values) {
  Tensor t = empty(std::move(shape), DType::i32);
  MOE_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "from_vector: ", values.size(),
            " values for shape ", shape_str(t.shape()));
  if (t.nbytes() > 0) std::memcpy(t.raw(), values.data(), t.nbytes());  // empty: no pointers
  return t;
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  int j = i < 0 ? i + n : i;
  MOE_CHECK(j >= 0 && j < n, "tensor ", describe(), ": no dimension ", i);
  return shape_[j];
}

std::string Tensor::describe() const {
  return (name_.empty() ? std::string("tensor") : name_) + shape_str(shape_) + " " +
         dtype_name(dtype_) + " " + device_.str();
}

uint16_t* Tensor::half_bits() {
  MOE_CHECK(dtype_ == DType::bf16 || dtype_ == DType::f16, describe(), ": not a 16-bit float");
  return reinterpret_cast<uint16_t*>(storage_.get());
}
const uint16_t* Tensor::half_bits() const {
  MOE_CHECK(dtype_ == DType::bf16 || dtype_ == DType::f16, describe(), ": not a 16-bit float");
  return reinterpret_cast<const uint16_t*>(storage_.get());
}

void Tensor::check_type(DType requested) const {
  MOE_CHECK(storage_ != nullptr, "tensor ", describe(), " is undefined");
  MOE_CHECK(requested == dtype_, "tensor ", describe(), " accessed as ", dtype_name(requested));
}

Tensor Tensor::reshape(Shape shape) const {
  MOE_CHECK(shape_numel(shape) == numel(), "reshape ", describe(), " to ", shape_str(shape),
            ": element counts differ");
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::view_as(DType dtype) const {
  MOE_CHECK(dtype_size(dtype) == dtype_size(dtype_), "view ", describe(), " as ", dtype_name(dtype),
            ": element sizes differ");
  Tensor t = *this;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  MOE_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "rows(", begin, ",", end,
            ") of ", describe());
  Tensor t = *this;
  int64_t row_elems = shape_[0] ? numel() / shape_[0] : 0;
  t.storage_ = std::shared_ptr<std::byte>(
      storage_, storage_.get() + begin * row_elems * static_cast<int64_t>(dtype_size(dtype_)));
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  copy_storage(t, *this);
  t.name_ = name_;
  return t;
}

void Tensor::copy_from(const Tensor& other) {
  const PartScope part(StepPart::memory);
  MOE_CHECK(other.shape_ == shape_, "copy into ", describe(), " from ", other.describe(),
            ": shapes differ");
  if (other.dtype_ == dtype_) {
    copy_storage(*this, other);
    return;
  }
  MOE_CHECK(is_floating(dtype_) && is_floating(other.dtype_), "copy into ", describe(), " from ",
            other.describe(), ": unsupported conversion");
  // Converted on the destination's device, by its table, after the source is moved there (a host
  // destination with a device source converts on the host).
  backend_for(device_).memory.convert(other.device_ == device_ ? other : other.to(device_), *this);
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype, device_);
  t.copy_from(*this);
  t.name_ = name_;
  return t;
}

std::vector<float> Tensor::to_vector() const {
  if (device_.kind != Device::cpu) return to(Device{}).to_vector();
  Tensor f = dtype_ == DType::f32 ? *this : to(DType::f32);
  const float* p = f.data<float>();
  return std::vector<float>(p, p + numel());
}

void Tensor::fill(float value) {
  const PartScope part(StepPart::memory);
  backend_for(device_).memory.fill(*this, value);
}

void Tensor::zero() {
  const PartScope part(StepPart::memory);
  backend_for(device_).memory.zero(*this);
}

void Tensor::expect_shape(const Shape& expected, const char* what) const {
  if (shape_ != expected)
    throw Error(str(what ? what : "shape check", ": ", describe(), " expected shape ",
                    shape_str(expected)));
}

void Tensor::expect_dtype(DType expected, const char* what) const {
  if (dtype_ != expected)
    throw Error(str(what ? what : "dtype check", ": ", describe(), " expected dtype ",
                    dtype_name(expected)));
}

}  // namespace moe
