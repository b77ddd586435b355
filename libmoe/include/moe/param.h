// Parameters: stable dotted names, storage dtype, fp32 gradients, fp32 view for compute.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moe/tensor.h"

namespace moe {

enum class InitKind { zeros, ones, normal };

struct Init {
  InitKind kind = InitKind::normal;
  float std = 0.02f;
  static Init zeros() { return {InitKind::zeros, 0.0f}; }
  static Init ones() { return {InitKind::ones, 0.0f}; }
  static Init normal(float std) { return {InitKind::normal, std}; }
};

// A parameter that holds one slice of a larger logical tensor (the experts one rank owns under
// expert parallelism, the columns of a sharded embedding): the local tensor is `global` with
// dimension `dim` cut to [start, start + count). Initial values are those the full tensor has at
// those positions, so a sharded model starts from exactly the single-process parameters.
struct ParamShard {
  Shape global;  // empty: the parameter is whole
  int dim = 0;
  int64_t start = 0, count = 0;
  bool defined() const { return !global.empty(); }
  Shape local_shape() const;  // global with dim cut to count
};

struct Param {
  std::string name;  // e.g. "blocks.3.moe.experts.w1"
  Tensor value;      // storage dtype (f32, bf16, f16)
  Tensor grad;       // fp32, same shape; backward accumulates (+=); undefined for an
                     // offloaded parameter (zero_grad skips it)
  Tensor compute;    // fp32 values the kernels read: `value` itself when f32, else an upcast copy
  bool expert = false;  // leading dimension indexes experts of one layer
  bool decay = true;    // AdamW weight decay applies (not for norms, biases)
  // No optimizer update and no gradient reduction: AdamW keeps no state for it, GradSync and ZeRO
  // leave it alone, and its gradient stays zero (no backward writes it). Explicit code changes it
  // the same way on every rank (the routers' selection bias: nn::update_selection_bias). Saved and
  // loaded like any parameter.
  bool frozen = false;
  ParamShard shard;  // defined when this rank holds a slice of the logical tensor
  Shape shape;       // the local shape (value's, when it has storage)
  Init init;         // how it was initialised (an ExpertStore initialises offloaded ones)
  // Expert state held by an nn::ExpertStore (offloaded training, moe/nn/expert_store.h): value,
  // grad and compute stay undefined; the store holds each expert's rows and initialises them
  // with ParamSet::initial_rows. Code that walks a ParamSet skips offloaded parameters.
  bool offloaded = false;

  const Tensor& w() const { return compute; }
  // Elements of the logical tensor (the whole of a sharded one).
  int64_t logical_numel() const {
    return shard.defined() ? shape_numel(shard.global) : shape_numel(shape);
  }
  int64_t numel() const { return shape_numel(shape); }
  // Call after `value` changed (optimizer step, checkpoint load).
  void refresh_compute();
};

// Owns every parameter of a model; addresses are stable, iteration is in creation order.
class ParamSet {
 public:
  explicit ParamSet(uint64_t seed = 0, DType dtype = DType::f32) : seed_(seed), dtype_(dtype) {}
  // `storage`: the value's dtype when it must not be the set's (the routers' selection bias is
  // always f32: its updates are far below a 16-bit value's spacing); none = dtype().
  Param& add(const std::string& name, Shape shape, Init init, bool decay = true,
             bool expert = false, std::optional<DType> storage = std::nullopt);
  // A slice of a logical tensor (see ParamShard); throws when the slice does not fit `global`.
  Param& add_shard(const std::string& name, const ParamShard& shard, Init init, bool decay = true,
                   bool expert = false, std::optional<DType> storage = std::nullopt);
  // Expert slots (FlexMoE's vExperts): a [rows.size(), ...] parameter whose row i starts as row
  // rows[i] of the logical tensor `global` (its single-process initial values), zeros where
  // rows[i] < 0 (an empty slot). Not a ParamShard: which logical row a slot holds changes while
  // training, and the caller keeps that map.
  Param& add_rows(const std::string& name, const Shape& global, const std::vector<int64_t>& rows,
                  Init init, bool decay, bool expert);
  // An expert parameter whose state an nn::ExpertStore holds (Param::offloaded): no memory is
  // allocated here. `shard` as for add_shard (an undefined one: the whole `shape`).
  Param& add_offloaded(const std::string& name, Shape shape, const ParamShard& shard, Init init,
                       bool decay);
  // The initial fp32 values of rows [row, row + rows) of p's leading dimension (one expert's
  // slice when row counts experts): bitwise the values add/add_shard give those rows. `out` is
  // f32 with rows * (numel / shape[0]) elements.
  void initial_rows(const Param& p, int64_t row, int64_t rows, float* out) const;
  // Parameters added while this is on start unwritten (not even zeroed) instead of their Init's
  // values, and a 16-bit one without its f32 compute copy: for a loader that overwrites every
  // one and then sets its compute tensor (infer::load_model), whose start would otherwise draw
  // and discard a normal value per weight (most of moe-infer's start-up on a 145M-parameter
  // model) and touch memory it replaces.
  void skip_initial_values(bool on) { skip_initial_values_ = on; }
  // Parameters added while this is on have no gradient (Param::grad undefined): for a model that
  // only runs forward passes (infer::load_model), which would otherwise hold an f32 gradient the
  // size of every parameter until lean_for_inference dropped it.
  void skip_gradients(bool on) { skip_gradients_ = on; }
  Param* find(const std::string& name);
  const Param* find(const std::string& name) const;
  Param& at(const std::string& name);  // throws naming the parameter
  size_t size() const { return params_.size(); }
  int64_t numel() const;
  DType dtype() const { return dtype_; }
  uint64_t seed() const { return seed_; }
  void zero_grad();
  // Moves every parameter (value, gradient, compute copy) to `device`; optimizer state made
  // afterwards follows them. Names and order do not change. A parameter already on `device` is
  // left as it is, its compute copy too (so moving a loaded CPU model to the CPU costs nothing).
  void to(Device device);
  Device device() const;  // where the parameters live (cpu when there are none)
  std::vector<Param*> all();
  std::vector<const Param*> all() const;

 private:
  void fill_initial(const Param& p, int64_t begin, int64_t end, float* out) const;
  uint64_t seed_;
  bool skip_initial_values_ = false, skip_gradients_ = false;
  DType dtype_;
  std::vector<std::unique_ptr<Param>> params_;
  std::map<std::string, Param*> by_name_;
};

}  // namespace moe
