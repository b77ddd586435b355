// Checkpoint conversions that change tensors in place (see moe/io/convert.h): dtype change and
// freeze for inference. Shape letters: E experts of a layer.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "io/convert_internal.h"
#include "moe/io/convert.h"
#include "moe/io/hdf5.h"

namespace moe::io {

// ---- dtype and freeze -------------------------------------------------------------------------

Checkpoint change_dtype(const Checkpoint& in, DType to, DTypeReport* report) {
  MOE_USAGE_CHECK(to == DType::f32 || to == DType::bf16 || to == DType::f16,
                  "--to must be f32, bf16 or f16 (got ", dtype_name(to), ")");
  MOE_USAGE_CHECK(in.sharding.rank < 0,
                  "dtype converts a whole checkpoint; this is one rank's shard: merge it first");
  DTypeReport r;
  Checkpoint out = in;
  out.model_config["dtype"] = dtype_name(to);
  const bool has_optim = !in.optim.empty();
  std::map<std::string, size_t> optim_index;
  for (size_t i = 0; i < in.optim.size(); ++i) optim_index[in.optim[i].name] = i;
  std::set<std::string> drop;  // optimizer tensors that no longer belong
  for (NamedTensor& nt : out.params) {
    const DType from = nt.tensor.dtype();
    if (!is_floating(from) || from == to) continue;
    const std::string master_name = "master." + nt.name;
    auto master = optim_index.find(master_name);
    const bool has_master = master != optim_index.end();
    if (has_master) {
      const Tensor& m = in.optim[master->second].tensor;
      MOE_CHECK(m.shape() == nt.tensor.shape() && m.dtype() == DType::f32, "optimizer tensor '",
                master_name, "' is ", m.describe(), ", its parameter ", nt.tensor.describe());
    }
    // The most precise values there are: the fp32 master when there is one.
    const Tensor exact = has_master ? in.optim[master->second].tensor : nt.tensor.to(DType::f32);
    Tensor converted = to == DType::f32 ? exact.clone() : exact.to(to);
    const float* x = exact.data<float>();
    std::vector<float> y = converted.to_vector();
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < exact.numel(); ++i) {
      if (std::isfinite(x[i]) && !std::isfinite(y[static_cast<size_t>(i)]))
        throw Error(str("tensor '", nt.name, "': value ", x[i], " is beyond the range of ",
                        dtype_name(to), " (it would become infinite)"));
      if (std::isfinite(x[i])) {
        scale = std::max(scale, std::fabs(static_cast<double>(x[i])));
        worst = std::max(worst, std::fabs(static_cast<double>(y[static_cast<size_t>(i)]) - x[i]));
      }
    }
    if (scale > 0) r.max_relative_error = std::max(r.max_relative_error, worst / scale);
    converted.set_name(nt.name);
    nt.tensor = std::move(converted);
    ++r.tensors_converted;
    if (!has_optim) continue;
    if (to == DType::f32) {
      if (has_master) {
        drop.insert(master_name);
        ++r.masters_dropped;
      }
    } else if (has_master) {
      ++r.masters_used;
    } else {
      out.optim.push_back({master_name, exact.clone(), nt.expert, nt.shard});
      ++r.masters_added;
    }
  }
  std::erase_if(out.optim, [&](const NamedTensor& t) { return drop.count(t.name) > 0; });
  if (report) *report = r;
  return out;
}

Checkpoint freeze(const Checkpoint& in) {
  MOE_USAGE_CHECK(in.sharding.rank < 0,
                  "freeze needs a whole checkpoint; this is one rank's shard: merge it first");
  Checkpoint out;
  out.model_config = in.model_config;
  out.train_config = nullptr;
  out.provenance = in.provenance;
  out.state = in.state;
  out.state.data_cursor = 0;
  out.sharding = Sharding{};
  out.tokenizer = in.tokenizer;
  // Each block's expert tensors right after the first of them: a layer's experts are one extent.
  std::vector<const NamedTensor*> order;
  std::set<const NamedTensor*> placed;
  for (size_t i = 0; i < in.params.size(); ++i) {
    const NamedTensor& nt = in.params[i];
    if (placed.count(&nt)) continue;
    order.push_back(&nt);
    placed.insert(&nt);
    if (!nt.expert) continue;
    const int64_t block = block_of_name(nt.name);
    for (size_t j = i + 1; j < in.params.size(); ++j) {
      const NamedTensor& other = in.params[j];
      if (other.expert && block_of_name(other.name) == block && !placed.count(&other)) {
        order.push_back(&other);
        placed.insert(&other);
      }
    }
  }
  for (const NamedTensor* nt : order) {
    if (nt->shard.defined())
      throw Error(str("freeze needs a whole checkpoint, but tensor '", nt->name, "' is a slice of ",
                      shape_str(nt->shard.global)));
    out.params.push_back({nt->name, nt->tensor, nt->expert, {}});
  }
  return out;
}

}  // namespace moe::io
