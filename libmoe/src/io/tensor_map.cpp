// map_tensor (moe/io/checkpoint.h): a conversion applied to one tensor, now or when it is read.
// Shape letters: E experts (the leading dimension of an expert tensor).
#include <memory>
#include <utility>

#include "moe/io/checkpoint.h"

namespace moe::io {

namespace {

// f's result for `what` must be of the shape and dtype promised; a wrong one is a bug in the
// conversion, named here rather than written into a dataset of another shape.
Tensor checked(Tensor t, const Shape& shape, DType dtype, const std::string& name,
               const std::string& what) {
  MOE_CHECK(t.defined() && t.dtype() == dtype && shape_numel(t.shape()) == shape_numel(shape),
            "tensor '", name, "' (", what, ") was converted to ",
            t.defined() ? t.describe() : std::string("nothing"), ", expected ", shape_str(shape),
            " ", dtype_name(dtype));
  t = t.reshape(shape);
  t.set_name(name);
  return t;
}

}  // namespace

NamedTensor map_tensor(const NamedTensor& in, const Shape& shape, DType dtype, TensorFn f) {
  NamedTensor out{in.name, Tensor(), in.expert, in.shard};
  if (in.held()) {
    out.tensor = checked(f(in.tensor, -1), shape, dtype, in.name, "whole");
    return out;
  }
  if (in.is_deferred()) {
    auto source = std::make_shared<TensorSource>();
    source->shape = shape;
    source->dtype = dtype;
    source->read = [in, shape, dtype, f = std::move(f)]() {
      return checked(f(in.whole(), -1), shape, dtype, in.name, "whole");
    };
    out.deferred = std::move(source);
    return out;
  }
  MOE_CHECK(!shape.empty() && shape[0] == in.shape()[0], "tensor '", in.name,
            "': a streamed expert tensor of ", in.shape()[0], " experts cannot become ",
            shape_str(shape));
  const Shape rest(shape.begin() + 1, shape.end());
  auto source = std::make_shared<ExpertSource>();
  source->shape = shape;
  source->dtype = dtype;
  source->read = [in, rest, dtype, f = std::move(f)](int64_t e) {
    return checked(f(in.expert_slice(e), e), rest, dtype, in.name, str("expert ", e));
  };
  out.source = std::move(source);
  return out;
}

void hold_all(std::vector<NamedTensor>& tensors) {
  for (NamedTensor& nt : tensors) {
    if (nt.held()) continue;
    Tensor t = nt.whole();
    t.set_name(nt.name);
    nt.tensor = std::move(t);
    nt.source = nullptr;
    nt.deferred = nullptr;
  }
}

void hold_all(Checkpoint& ckpt) {
  hold_all(ckpt.params);
  hold_all(ckpt.optim);
}

}  // namespace moe::io
