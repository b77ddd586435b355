// Checkpoint conversions that change tensors in place (see moe/io/convert.h): dtype change and
// freeze for inference. Shape letters: E experts of a layer.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "io/convert_internal.h"
#include "moe/io/convert.h"
#include "moe/io/hdf5.h"
#include "moe/settings.h"

namespace moe::io {

// ---- dtype and freeze -------------------------------------------------------------------------

namespace {

// `exact` (f32) rounded to `to`; values beyond the target's range are an Error (never silently
// infinite). The largest error relative to the tensor's (or slice's) largest magnitude goes into
// *worst_relative.
Tensor round_to(const Tensor& exact, DType to, const std::string& name, double* worst_relative) {
  Tensor converted = to == DType::f32 ? exact.clone() : exact.to(to);
  const float* x = exact.data<float>();
  std::vector<float> y = converted.to_vector();
  double scale = 0, worst = 0;
  for (int64_t i = 0; i < exact.numel(); ++i) {
    if (std::isfinite(x[i]) && !std::isfinite(y[static_cast<size_t>(i)]))
      throw Error(str("tensor '", name, "': value ", x[i], " is beyond the range of ",
                      dtype_name(to), " (it would become infinite)"));
    if (std::isfinite(x[i])) {
      scale = std::max(scale, std::fabs(static_cast<double>(x[i])));
      worst = std::max(worst, std::fabs(static_cast<double>(y[static_cast<size_t>(i)]) - x[i]));
    }
  }
  if (scale > 0 && worst_relative) *worst_relative = std::max(*worst_relative, worst / scale);
  return converted;
}

}  // namespace

NamedTensor exact_values(const NamedTensor& param, const NamedTensor* master) {
  if (master) {
    MOE_CHECK(master->shape() == param.shape() && master->dtype() == DType::f32,
              "optimizer tensor '", master->name, "' is ", shape_str(master->shape()), " ",
              dtype_name(master->dtype()), ", its parameter ", shape_str(param.shape()), " ",
              dtype_name(param.dtype()));
    NamedTensor m = *master;
    m.expert = param.expert;
    return m;
  }
  return map_tensor(param, param.shape(), DType::f32,
                    [](const Tensor& x, int64_t) { return x.to(DType::f32); });
}

Checkpoint change_dtype(const Checkpoint& in, DType to, DTypeReport* report) {
  MOE_USAGE_CHECK(to == DType::f32 || to == DType::bf16 || to == DType::f16,
                  flag_for(Setting::to_dtype), " must be f32, bf16 or f16 (got ", dtype_name(to),
                  ")");
  MOE_USAGE_CHECK(in.sharding.rank < 0,
                  "dtype converts a whole checkpoint; this is one rank's shard: merge it first");
  DTypeReport local;
  DTypeReport& r = report ? *report : local;
  r = DTypeReport{};
  double* worst = report ? &report->max_relative_error : nullptr;
  Checkpoint out = in;
  out.model_config["dtype"] = dtype_name(to);
  const bool has_optim = !in.optim.empty();
  std::map<std::string, size_t> optim_index;
  for (size_t i = 0; i < in.optim.size(); ++i) optim_index[in.optim[i].name] = i;
  std::set<std::string> drop;  // optimizer tensors that no longer belong
  for (NamedTensor& nt : out.params) {
    const DType from = nt.dtype();
    if (!is_floating(from) || from == to) continue;
    const std::string master_name = "master." + nt.name;
    auto master = optim_index.find(master_name);
    const bool has_master = master != optim_index.end();
    const NamedTensor exact = exact_values(nt, has_master ? &in.optim[master->second] : nullptr);
    const std::string name = nt.name;
    nt = map_tensor(exact, nt.shape(), to, [to, name, worst](const Tensor& x, int64_t) {
      return round_to(x, to, name, worst);
    });
    nt.name = name;
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
      NamedTensor m = exact;
      m.name = master_name;
      if (m.held()) m.tensor = m.tensor.clone();
      out.optim.push_back(std::move(m));
      ++r.masters_added;
    }
  }
  std::erase_if(out.optim, [&](const NamedTensor& t) { return drop.count(t.name) > 0; });
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
    NamedTensor kept = *nt;  // held, streamed or deferred: the bytes are not touched
    kept.shard = {};
    out.params.push_back(std::move(kept));
  }
  return out;
}

}  // namespace moe::io
