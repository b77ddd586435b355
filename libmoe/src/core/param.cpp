#include "moe/param.h"

#include <omp.h>

#include "core/parallel.h"
#include "moe/rng.h"

namespace moe {

void Param::refresh_compute() {
  // Quantised weights (q8_0 row groups, q4_k / q6_k / mxfp4 rows) of a quantised checkpoint
  // (inference only), which the CPU kernels read in place (x W^T ops widen them on the fly). A
  // bf16/f16 weight matrix may likewise be its own compute tensor for CPU inference
  // (infer::lean_for_inference), until the next refresh.
  if (value.dtype() == DType::f32 || is_quantized(value.dtype())) {
    compute = value;
  } else {
    if (!compute.defined() || compute.dtype() != DType::f32 || compute.raw() == value.raw() ||
        compute.shape() != value.shape())
      compute = Tensor::empty(value.shape(), DType::f32, value.device());
    compute.copy_from(value);
    compute.set_name(name);
  }
}

Shape ParamShard::local_shape() const {
  Shape s = global;
  s.at(static_cast<size_t>(dim)) = count;
  return s;
}

Param& ParamSet::add(const std::string& name, Shape shape, Init init, bool decay, bool expert,
                     std::optional<DType> storage) {
  ParamShard whole;
  whole.global = std::move(shape);
  whole.count = whole.global.empty() ? 0 : whole.global[0];
  Param& p = add_shard(name, whole, init, decay, expert, storage);
  p.shard = {};
  return p;
}

Param& ParamSet::add_shard(const std::string& name, const ParamShard& shard, Init init, bool decay,
                           bool expert, std::optional<DType> storage) {
  MOE_CHECK(!by_name_.count(name), "parameter '", name, "' defined twice");
  const Shape& global = shard.global;
  const bool scalar = global.empty();
  MOE_CHECK(scalar || (shard.dim >= 0 && shard.dim < static_cast<int>(global.size()) &&
                       shard.start >= 0 && shard.count >= 0 &&
                       shard.start + shard.count <= global[static_cast<size_t>(shard.dim)]),
            "parameter '", name, "': slice [", shard.start, ", ", shard.start + shard.count,
            ") of dimension ", shard.dim, " does not fit ", shape_str(global));
  Shape shape = scalar ? Shape{} : shard.local_shape();
  auto p = std::make_unique<Param>();
  p->name = name;
  p->decay = decay;
  p->expert = expert;
  p->shard = shard;
  p->shape = shape;
  p->init = init;
  const DType dtype = storage.value_or(dtype_);
  if (skip_initial_values_) {
    // Not even zeroed: the pages stay untouched until the loader writes them (a Q8_0 weight's
    // placeholder is replaced, never written). No compute copy yet for a 16-bit value: the
    // loader makes the one it needs once the value is in.
    p->value = Tensor::empty(shape, dtype);
  } else {
    Tensor master = Tensor::empty(shape, DType::f32);
    fill_initial(*p, 0, master.numel(), master.data<float>());
    p->value = dtype == DType::f32 ? master : master.to(dtype);
  }
  p->value.set_name(name);
  if (!skip_gradients_) p->grad = Tensor::zeros(shape, DType::f32).set_name(name + ".grad");
  if (!skip_initial_values_ || dtype == DType::f32) p->refresh_compute();
  Param& ref = *p;
  by_name_[name] = p.get();
  params_.push_back(std::move(p));
  return ref;
}

Param& ParamSet::add_rows(const std::string& name, const Shape& global,
                          const std::vector<int64_t>& rows, Init init, bool decay, bool expert) {
  MOE_CHECK(!global.empty(), "parameter '", name, "': slots of a scalar");
  for (int64_t r : rows)
    MOE_CHECK(r < global[0], "parameter '", name, "': slot of row ", r, " of ", shape_str(global));
  Shape shape = global;
  shape[0] = static_cast<int64_t>(rows.size());
  Param& p = add(name, shape, Init::zeros(), decay, expert);
  p.init = init;
  const int64_t per_row = shape_numel(global) / global[0];
  Tensor master = Tensor::zeros(shape, DType::f32);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0) continue;
    Param logical;  // row rows[i] of the logical tensor, as add_shard would give it
    logical.name = name;
    logical.init = init;
    logical.shard = ParamShard{global, 0, rows[i], 1};
    logical.shape = logical.shard.local_shape();
    fill_initial(logical, 0, per_row, master.data<float>() + static_cast<int64_t>(i) * per_row);
  }
  p.value.copy_from(dtype_ == DType::f32 ? master : master.to(dtype_));
  p.refresh_compute();
  return p;
}

// Elements [begin, end) of p's local tensor as add_shard initialises them. Normal values are keyed
// by the parameter's name and the element's index in the logical tensor: adding a parameter never
// changes another one's values, and a slice holds the full tensor's values.
void ParamSet::fill_initial(const Param& p, int64_t begin, int64_t end, float* out) const {
  const Init& init = p.init;
  const int64_t n = end - begin;
  if (init.kind != InitKind::normal) {
    const float v = init.kind == InitKind::ones ? 1.0f : 0.0f;
    for (int64_t i = 0; i < n; ++i) out[i] = v;
    return;
  }
  const ParamShard& shard = p.shard;
  const Shape& global = shard.defined() ? shard.global : p.shape;
  const bool scalar = global.empty();
  const int dim = shard.defined() ? shard.dim : 0;
  const int64_t count = shard.defined() ? shard.count : (scalar ? 0 : global[0]);
  const int64_t start = shard.defined() ? shard.start : 0;
  const uint64_t key = rng_key(seed_, {hash_name(p.name)});
  int64_t inner = 1;  // elements per index of the sliced dimension
  for (size_t d = scalar ? 0 : static_cast<size_t>(dim) + 1; d < global.size(); ++d)
    inner *= global[d];
  const int64_t local_span = scalar ? shape_numel(p.shape) : count * inner;
  const int64_t global_span = scalar ? local_span : global[static_cast<size_t>(dim)] * inner;
  const int64_t offset = scalar ? 0 : start * inner;
  const float stdev = init.std;
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelWork)
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = begin + j;
    int64_t outer = local_span ? i / local_span : 0, within = local_span ? i % local_span : 0;
    int64_t g = outer * global_span + offset + within;
    out[j] = stdev * rng_normal(key, static_cast<uint64_t>(g));
  }
}

void ParamSet::initial_rows(const Param& p, int64_t row, int64_t rows, float* out) const {
  MOE_CHECK(!p.shape.empty() && row >= 0 && rows >= 0 && row + rows <= p.shape[0], "parameter '",
            p.name, "': rows [", row, ", ", row + rows, ") are not within ", shape_str(p.shape));
  const int64_t per_row = shape_numel(p.shape) / p.shape[0];
  fill_initial(p, row * per_row, (row + rows) * per_row, out);
}

Param& ParamSet::add_offloaded(const std::string& name, Shape shape, const ParamShard& shard,
                               Init init, bool decay) {
  MOE_CHECK(!by_name_.count(name), "parameter '", name, "' defined twice");
  MOE_CHECK(!shape.empty() && (!shard.defined() || shard.local_shape() == shape), "parameter '",
            name, "': offloaded shape ", shape_str(shape), " is not its slice");
  auto p = std::make_unique<Param>();
  p->name = name;
  p->decay = decay;
  p->expert = true;
  p->shard = shard;
  p->shape = std::move(shape);
  p->init = init;
  p->offloaded = true;
  Param& ref = *p;
  by_name_[name] = p.get();
  params_.push_back(std::move(p));
  return ref;
}

Param* ParamSet::find(const std::string& name) {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}
const Param* ParamSet::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}
Param& ParamSet::at(const std::string& name) {
  Param* p = find(name);
  MOE_CHECK(p, "no parameter named '", name, "'");
  return *p;
}

int64_t ParamSet::numel() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p->numel();
  return n;
}

void ParamSet::to(Device device) {
  for (auto& p : params_) {
    if (p->offloaded) continue;  // its store moves it
    // Already there: left as it is. Rebuilding its compute copy would undo a 16-bit matrix read
    // in place (infer::lean_for_inference) by making an f32 copy of it again.
    if ((!p->value.defined() || p->value.device() == device) &&
        (!p->grad.defined() || p->grad.device() == device))
      continue;
    p->value = p->value.to(device);
    if (p->grad.defined()) p->grad = p->grad.to(device);
    p->compute = Tensor();
    p->refresh_compute();
  }
}

Device ParamSet::device() const {
  for (const auto& p : params_) {
    if (p->offloaded) continue;
    if (p->value.defined()) return p->value.device();
    if (p->grad.defined()) return p->grad.device();  // a value released by --zero 3
  }
  return Device{};
}

void ParamSet::zero_grad() {
  for (auto& p : params_)
    if (p->grad.defined()) p->grad.zero();  // an expert ring drops expert gradients
}

std::vector<Param*> ParamSet::all() {
  std::vector<Param*> v;
  for (auto& p : params_) v.push_back(p.get());
  return v;
}
std::vector<const Param*> ParamSet::all() const {
  std::vector<const Param*> v;
  for (const auto& p : params_) v.push_back(p.get());
  return v;
}

}  // namespace moe
